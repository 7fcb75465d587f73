"""A dependency-free progress bar for management commands."""

from __future__ import annotations


class ProgressBar:
    """Draws ``[#####-----] 5/10 label`` on a terminal; prints nothing when not a TTY."""

    def __init__(self, total: int, stream, *, width: int = 30, enabled: bool = True):
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream
        self.width = width
        isatty = getattr(getattr(stream, "_out", stream), "isatty", lambda: False)
        self.enabled = enabled and isatty()

    def advance(self, label: str = "") -> None:
        self.done += 1
        self._draw(label)

    def __call__(self, done: int, total: int, label: str = "") -> None:
        """Use the bar as a ``progress(done, total)`` callback of a service function."""
        self.done, self.total = done, max(total, 1)
        self._draw(label)

    def _draw(self, label: str = "") -> None:
        if not self.enabled:
            return
        filled = int(self.width * self.done / self.total)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label[:40]:<40}", ending="")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("")
