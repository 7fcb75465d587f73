"""What extracting a PDF page's text would cost, measured before it is extracted."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

# A call of a named resource in a content stream: "/Name Do" (an XObject), "/Name scn" or
# "/Name SCN" (a pattern), "/Name gs" (a graphics state, whose soft mask is a form) and
# "/Tag /Name BDC" (marked content whose property list may carry an ActualText). Bounded,
# disjoint quantifiers (name characters exclude whitespace), so matching stays linear.
_NAMED_CALL = re.compile(
    rb"/([^\s/\[\]()<>{}%]{1,127})\s{1,32}(Do|scn|SCN|gs|BDC)(?![^\s/\[\]()<>{}%])"
)
_CATEGORY = {
    b"Do": "XObject",
    b"scn": "Pattern",
    b"SCN": "Pattern",
    b"gs": "ExtGState",
    b"BDC": "Properties",
}
_CATEGORIES = ("XObject", "Pattern", "ExtGState", "Properties")
_NAME_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")
_REFERENCE = re.compile(r"(\d{1,10}) \d{1,5} R")
_MAX_FORM_DEPTH = 16
# MuPDF maps one character code to at most this many characters (longer ToUnicode
# destinations are ignored): the most a code can amplify.
MAX_CHARS_PER_CODE = 256
# A ToUnicode CMap larger than this (decoded) is not read: it is assumed to amplify fully.
_MAX_CMAP_BYTES = 4 * 1024 * 1024
# The tokens of a CMap that matter: parentheses and backslashes (literal strings, which nest),
# hex strings, and the keywords around mappings.
_CMAP_TOKEN = re.compile(rb"[()\\]|<[0-9A-Fa-f \t\r\n\f\x00]*>|beginbf|endbf")


def longest_cmap_string(data: bytes) -> int:
    """The most bytes a string inside the mappings (``beginbfchar`` / ``beginbfrange``
    sections) of a CMap holds: an upper bound (an escape counts in full).

    A ToUnicode CMap maps a code to the UTF-16 string of its destination, so its longest
    destination bounds the characters one code yields. Linear: one pass of a regular
    expression whose alternatives are disjoint, literal strings' nesting tracked by a counter
    (a keyword inside a string is part of the string, as for MuPDF).
    """
    longest = depth = start = 0
    inside = False
    skip = -1
    for match in _CMAP_TOKEN.finditer(data):
        at, token = match.start(), match.group()
        if at < skip:
            continue  # the character after a backslash
        if depth:
            if token == b"\\":
                skip = at + 2
            elif token == b"(":
                depth += 1
            elif token == b")":
                depth -= 1
                if not depth and inside:
                    longest = max(longest, at - start - 1)
            continue
        if token == b"(":
            depth, start = 1, at
        elif token == b"beginbf" or token == b"endbf":
            inside = token == b"beginbf"
        elif inside and token.startswith(b"<"):
            digits = len(token) - 2 - sum(token.count(c) for c in (b" ", b"\t", b"\r", b"\n"))
            longest = max(longest, (digits + 1) // 2)
    if depth and inside:  # an unterminated string runs to the end
        longest = max(longest, len(data) - start - 1)
    return longest


class PageCost:
    """What extracting one page's text would cost: bytes of drawing instructions interpreted,
    each weighted by the characters it can produce, plus the characters produced elsewhere.

    Text extraction (MuPDF) cannot be interrupted from Python and needs memory in proportion
    to what a page draws and to the characters it yields: a 600 KB file whose single page
    inflates to 200 MB of text operators used 6 GB; a 5.4 KB file whose font maps one code
    to 128 characters (a ToUnicode CMap) reached 11.8 GB. So each page is measured first,
    without keeping its data:

    - content streams are decoded through MuPDF's filters and discarded (``fz_skip``); each
      byte counts as many times as the most characters a font of its resources maps one
      code to (1 for ordinary fonts, up to :data:`MAX_CHARS_PER_CODE`);
    - every named resource a stream calls counts once per call: a Form XObject (``Do``), a
      tiling pattern (``scn``), a soft mask's form (``gs``) cost what their own streams cost,
      a marked-content property list (``BDC``) costs its ActualText's characters. A small
      form drawn a million times is seen for what it costs. A name the resources do not hold
      as written costs the most of its kind (a hostile name escape must not hide a call);
    - annotation appearance streams count too.

    Measuring stops once the budget is exceeded.
    """

    def __init__(self, document, budget: int):
        import pymupdf

        self.mupdf = pymupdf.mupdf
        self.document = document
        self.pdf = self.mupdf.pdf_document_from_fz_document(document.this)
        self.budget = budget
        self.stream_costs: dict[int, int] = {}
        self.font_amplification: dict[int, int] = {}  # by font object number, whole document
        self.amplification = 1  # the most seen so far, for the error message

    def decoded_size(self, xref: int, cap: int) -> int:
        try:
            stream = self.mupdf.pdf_open_stream_number(self.pdf, xref)
            return self.mupdf.fz_skip(stream, max(cap, 0) + 1)
        except Exception:
            # Not a stream, or a filter error: MuPDF's text extraction skips such data too.
            return 0

    def calls(self, xref: int, names: dict[str, dict[str, Any]]) -> Counter:
        """How often the stream calls each named resource: (category, name) -> count; a name
        the resources lack is counted under (category, None)."""
        try:
            data = self.document.xref_stream(xref) or b""  # size already checked: bounded
        except Exception:
            return Counter()
        calls: Counter = Counter()
        for match in _NAMED_CALL.finditer(data):
            name, operator = match.groups()
            if b"#" in name:
                name = _NAME_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), name)
            category = _CATEGORY[operator]
            text = name.decode("latin-1")
            calls[(category, text if text in names.get(category, {}) else None)] += 1
        return calls

    def entries(self, resources, category: str) -> dict[str, Any]:
        m = self.mupdf
        if resources is None:
            return {}
        table = m.pdf_dict_gets(resources, category)
        if not m.pdf_is_dict(table):
            return {}
        return {
            m.pdf_to_name(m.pdf_dict_get_key(table, i)): m.pdf_dict_get_val(table, i)
            for i in range(m.pdf_dict_len(table))
        }

    def cmap_amplification(self, cmap, depth: int = 0) -> int:
        m = self.mupdf
        number = m.pdf_to_num(cmap)
        if not m.pdf_is_stream(cmap) or not number:
            return 1  # a predefined CMap (Identity-H...): one character per code
        if self.decoded_size(number, _MAX_CMAP_BYTES) > _MAX_CMAP_BYTES:
            return MAX_CHARS_PER_CODE
        try:
            data = self.document.xref_stream(number) or b""
        except Exception:
            return 1
        amplification = max(1, longest_cmap_string(data) // 2)  # UTF-16: 2 bytes a char
        parent = m.pdf_dict_gets(cmap, "UseCMap")
        if depth < 4 and m.pdf_is_stream(parent):
            amplification = max(amplification, self.cmap_amplification(parent, depth + 1))
        return min(amplification, MAX_CHARS_PER_CODE)

    def characters_per_byte(self, resources) -> int:
        """The most characters one byte of a stream using ``resources`` can produce."""
        m = self.mupdf
        most = 1
        for font in self.entries(resources, "Font").values():
            number = m.pdf_to_num(font)
            if number not in self.font_amplification or not number:
                self.font_amplification[number] = self.cmap_amplification(
                    m.pdf_dict_gets(font, "ToUnicode")
                )
            most = max(most, self.font_amplification[number])
        self.amplification = max(self.amplification, most)
        return most

    def resources_of(self, holder, fallback):
        m = self.mupdf
        resources = m.pdf_dict_get_inheritable(holder, m.PDF_ENUM_NAME_Resources)
        # A form without resources uses its caller's (MuPDF does so).
        return resources if m.pdf_is_dict(resources) else fallback

    def stream(self, holder, fallback, depth: int, spent: int) -> int:
        """The cost of the content stream ``holder`` (a stream object), ``spent`` already
        counted on this page."""
        m = self.mupdf
        number = m.pdf_to_num(holder)
        if not number or not m.pdf_is_stream(holder):
            return 0
        resources = self.resources_of(holder, fallback)
        weight = self.characters_per_byte(resources)
        left = self.budget - spent
        total = self.decoded_size(number, left // weight) * weight
        if total > left:
            return total
        names = {category: self.entries(resources, category) for category in _CATEGORIES}
        for (category, name), count in self.calls(number, names).items():
            table = names.get(category, {})
            targets = table.values() if name is None else [table[name]]
            unit = max(
                (self.called(category, target, resources, depth) for target in targets),
                default=0,
            )
            total += count * unit
            if total > left:
                return total
        return total

    def called(self, category: str, target, resources, depth: int) -> int:
        """The cost of one call of a named resource."""
        m = self.mupdf
        if category == "Properties":
            actual = m.pdf_dict_gets(target, "ActualText")
            return len(m.pdf_to_text_string(actual)) if m.pdf_is_string(actual) else 0
        if category == "ExtGState":
            target = m.pdf_dict_getp(target, "SMask/G")
        elif category == "XObject" and m.pdf_to_name(m.pdf_dict_gets(target, "Subtype")) != "Form":
            return 0  # an image
        if depth >= _MAX_FORM_DEPTH or not m.pdf_is_stream(target):
            return 0  # a shading pattern, no soft mask
        number = m.pdf_to_num(target)
        if number not in self.stream_costs:
            self.stream_costs[number] = 0  # a form drawing itself: MuPDF stops that loop
            self.stream_costs[number] = self.stream(target, resources, depth + 1, 0)
        return self.stream_costs[number]

    def annotation_streams(self, page) -> list[int]:
        kind, value = self.document.xref_get_key(page.xref, "Annots")
        if kind == "xref":  # an indirect array
            value = self.document.xref_object(int(value.split()[0]), compressed=True)
        elif kind != "array":
            return []
        xrefs = []
        for annotation in _REFERENCE.findall(value or ""):
            kind, appearance = self.document.xref_get_key(int(annotation), "AP/N")
            if kind in ("xref", "dict"):
                xrefs.extend(int(ref) for ref in _REFERENCE.findall(appearance))
        return xrefs

    def __call__(self, page) -> int:
        m = self.mupdf
        self.stream_costs = {}  # forms without resources use the page's
        resources = self.resources_of(m.pdf_new_indirect(self.pdf, page.xref, 0), None)
        total = 0
        for xref in [*page.get_contents(), *self.annotation_streams(page)]:
            total += self.stream(m.pdf_new_indirect(self.pdf, xref, 0), resources, 0, total)
            if total > self.budget:
                return total
        return total
