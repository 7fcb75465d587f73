from pathlib import Path

from django import forms
from django.conf import settings
from django.core.validators import MaxLengthValidator

from ..agent.steps import PHASES, STEPS
from ..conf import get_setting
from ..exceptions import InvalidInput
from ..modes import SearchMode
from ..validation import clean_collection_name, clean_filename, upload_source_id

FORMATS = [("text", "Plain text"), ("markdown", "Markdown")]


COLLECTION_HELP = "Created when it does not exist."
SOURCE_HELP = (
    "Your own identifier for this document (a path, a URL, a record id): it names the document "
    "across versions. Empty: none."
)


def upload_types() -> tuple[dict, str]:
    """The extensions an upload may have, as the ingestion path decides them: the parser
    registry (the built-ins and ``DJANGO_RAG["PARSERS"]``), with one extension per parser in
    words (".txt, .md or .pdf"; aliases such as .markdown are accepted, not listed)."""
    from ..ingestion.parsers import parser_registry

    registry = parser_registry()
    named, seen = [], set()
    for extension, parser in registry.items():
        key = parser if isinstance(parser, str) else id(parser)
        if key not in seen:
            seen.add(key)
            named.append(extension)
    words = ", ".join(named[:-1]) + " or " + named[-1] if len(named) > 1 else "".join(named)
    return registry, words


# The dashboard's starting mode for Search and Ask alike: hybrid had the best nDCG@10 on BEIR
# SciFact (0.734 against 0.679 semantic and 0.682 full-text, docs/benchmarks.md). The library's
# own default (SEARCH["MODE"], semantic) is kept for code: it is the cheapest mode.
DASHBOARD_MODE = SearchMode.HYBRID.value


def dashboard_mode(modes) -> str:
    """The mode the Search and Ask forms start in: ``DJANGO_RAG["SEARCH"]["MODE"]`` when the
    project sets it, else :data:`DASHBOARD_MODE` (``modes``: the choices offered)."""
    chosen = ((getattr(settings, "DJANGO_RAG", None) or {}).get("SEARCH") or {}).get("MODE")
    if chosen:
        name = SearchMode.parse(get_setting("SEARCH")["MODE"]).value
        if name in dict(modes):
            return name
    return DASHBOARD_MODE


def default_collection(form: forms.Form) -> None:
    """The configured default collection as the field's initial value (read per form)."""
    form.fields["collection"].initial = get_setting("DEFAULT_COLLECTION")


class OwnIds:
    """Element ids prefixed with ``id_prefix``: the Documents page shows the paste and upload
    forms together, and both have a "collection" and a "source_id" (ids must be unique for
    their labels to work)."""

    id_prefix = ""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("auto_id", f"{self.id_prefix}-%s")
        super().__init__(*args, **kwargs)


class IngestTextForm(OwnIds, forms.Form):
    id_prefix = "text"

    collection = forms.CharField(max_length=255, help_text=COLLECTION_HELP)
    title = forms.CharField(
        max_length=500,
        required=False,
        help_text="Shown in lists and citations. Empty: the source id or the first words.",
    )
    source_id = forms.CharField(max_length=512, required=False, help_text=SOURCE_HELP)
    format = forms.ChoiceField(
        choices=FORMATS,
        initial="text",
        help_text="Markdown is chunked along its headings.",
    )
    text = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 8}),
        help_text="Chunked and embedded at once; searchable when the page returns.",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        default_collection(self)


class UploadForm(OwnIds, forms.Form):
    id_prefix = "upload"

    collection = forms.CharField(max_length=255, help_text=COLLECTION_HELP)
    file = forms.FileField()
    source_id = forms.CharField(
        max_length=512, required=False, help_text=SOURCE_HELP + " Default: the file name."
    )
    replace = forms.BooleanField(
        required=False,
        help_text="Replace the stored documents with the same source id (off: keep both).",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        default_collection(self)
        limit = get_setting("DASHBOARD")["MAX_UPLOAD_BYTES"] // (1024 * 1024)
        self.parsers, self.types = upload_types()
        self.fields["file"].help_text = f"A {self.types} file of at most {limit} MB."

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = get_setting("DASHBOARD")["MAX_UPLOAD_BYTES"]
        if upload.size > limit:
            raise forms.ValidationError(f"The file is larger than {limit // (1024 * 1024)} MB.")
        # The rule get_parser() applies: the name's last suffix, in any case.
        if Path(upload.name).suffix.lower() not in self.parsers:
            raise forms.ValidationError(f"Upload a {self.types} file.")
        try:
            clean_filename(upload.name)
        except InvalidInput as exc:
            raise forms.ValidationError(str(exc)) from exc
        return upload

    def clean_collection(self):
        try:
            return clean_collection_name(self.cleaned_data["collection"])
        except InvalidInput:
            raise forms.ValidationError(
                "Enter a collection name of at most 255 characters, with something visible in it."
            ) from None

    def clean(self):
        """Every upload gets a source id: the one typed, else the file's name. *Replace* then
        always has one to replace (the library refuses replace=True without it)."""
        data = super().clean()
        upload = data.get("file")
        if upload is None or "source_id" in self.errors:
            return data
        typed = data.get("source_id") or ""
        try:
            data["source_id"] = upload_source_id(typed, upload.name)
        except InvalidInput:
            if typed:
                self.add_error(
                    "source_id", "The source id has a character that cannot be stored: retype it."
                )
            else:
                self.add_error(
                    "source_id",
                    "The file's name cannot serve as its source id (more than 512 characters, "
                    "or a character that cannot be stored): enter a source id.",
                )
        return data


def mode_choices() -> list[tuple[str, str]]:
    """The search modes as choices: the library's own list (``django_rag.modes.MODES``), read
    when a form is made, so the forms offer exactly the modes ``search()`` accepts."""
    from ..modes import MODES, label

    return [(mode, label(mode)) for mode in MODES]


def limit_query(field: forms.CharField) -> None:
    """Bound a query/question field by MAX_QUERY_CHARS (read per form: never at import)."""
    limit = get_setting("MAX_QUERY_CHARS")
    field.max_length = limit
    field.validators.append(MaxLengthValidator(limit))
    field.widget.attrs["maxlength"] = str(limit)


class CollectionForm(forms.Form):
    """A new collection: its name must not be taken (editing a description is another form)."""

    name = forms.CharField(
        max_length=255, help_text="Unique. Documents name their collection when ingested."
    )
    description = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        required=False,
        help_text="What the collection holds: the agent's select step reads it to choose "
        "collections for a question.",
    )

    def clean_name(self):
        from ..models import Collection

        name = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("A collection needs a name.")
        if Collection.objects.filter(name=name).exists():
            raise forms.ValidationError(
                f"A collection named “{name}” already exists: edit its description in the "
                "table above, or choose another name."
            )
        return name


class DescriptionForm(forms.Form):
    """The description of an existing collection."""

    name = forms.CharField(max_length=255, widget=forms.HiddenInput)
    description = forms.CharField(required=False)


class SearchForm(forms.Form):
    q = forms.CharField(
        label="Query", required=False, help_text="A question or keywords, as a user would type."
    )
    mode = forms.ChoiceField(
        choices=(),
        required=False,
        help_text="Semantic: meaning (embeddings). Full-text: the words (BM25). "
        "Hybrid: both, fused.",
    )
    limit = forms.IntegerField(
        min_value=1, max_value=100, required=False, help_text="Results per mode (1 to 100)."
    )
    collection = forms.MultipleChoiceField(
        choices=[], required=False, help_text="None selected: every collection you can see."
    )
    semantic_weight = forms.FloatField(min_value=0, required=False)
    fulltext_weight = forms.FloatField(min_value=0, required=False)
    threshold = forms.FloatField(
        required=False,
        help_text="The lowest score kept, on each mode's own scale (semantic: cosine 0..1; "
        "full-text: BM25; hybrid: the fused score). Empty: none.",
    )
    compare = forms.BooleanField(required=False, label="Compare the three modes side by side")

    def __init__(self, *args, collections=(), **kwargs):
        super().__init__(*args, **kwargs)
        search = get_setting("SEARCH")
        self.fields["collection"].choices = [(name, name) for name in collections]
        self.fields["mode"].choices = modes = mode_choices()
        self.fields["mode"].initial = dashboard_mode(modes)
        self.fields["limit"].initial = search["LIMIT"]
        self.fields["limit"].widget.attrs["placeholder"] = str(search["LIMIT"])
        for name, key, other in (
            ("semantic_weight", "SEMANTIC_WEIGHT", "full-text"),
            ("fulltext_weight", "FULLTEXT_WEIGHT", "semantic"),
        ):
            field = self.fields[name]
            field.widget.attrs.update({"placeholder": str(search[key]), "step": "any"})
            field.help_text = (
                f"Hybrid mode only; relative to the {other} weight. Empty: the default, "
                f"{search[key]} (DJANGO_RAG['SEARCH']['{key}']); with "
                f"{search['FUSION']!r} fusion it is the starting point."
            )
        self.fields["threshold"].widget.attrs.update({"step": "any", "placeholder": "none"})
        self.fields["compare"].help_text = "Runs semantic, full-text and hybrid on the query."
        limit_query(self.fields["q"])


KINDS = [
    ("ask", "Single ask (streamed)"),
    ("pipeline", "Pipeline (the steps you tick)"),
    ("loop", "Loop (the model calls search tools)"),
]


def pipeline_choices() -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The Ask page's pipeline checkboxes by phase, from the step registry: each optional step
    of a pipeline and each flag a step offers (``answer``'s ``self_correct``), as
    ``(name, label, description)``."""
    groups = []
    for phase, title in PHASES.items():
        choices = []
        for spec in STEPS.in_order():
            if spec.phase != phase or not spec.pipeline:
                continue
            if not spec.always:
                choices.append((spec.name, spec.label, spec.summary))
            choices.extend((flag, label, f"An option of the {spec.name} step.")
                           for flag, label in spec.flags)  # fmt: skip
        if choices:
            groups.append((title, choices))
    return groups


class AskForm(forms.Form):
    question = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="Answered by the configured LLM (DJANGO_RAG['LLM']) from the chunks found.",
    )
    kind = forms.ChoiceField(
        choices=KINDS, required=False, widget=forms.RadioSelect, label="How",
        help_text="Empty: the pipeline when steps are ticked, else a single ask.",
    )  # fmt: skip
    collection = forms.ChoiceField(
        choices=[], required=False, help_text="Where to look for the context."
    )
    mode = forms.ChoiceField(choices=(), help_text="How the context is searched.")
    limit = forms.IntegerField(
        min_value=1, max_value=20, initial=5, help_text="Chunks given to the LLM (1 to 20)."
    )
    graph = forms.BooleanField(
        required=False, label="Use the knowledge graph",
        help_text="Fuses the graph's chunks into every search (needs a built graph).",
    )  # fmt: skip
    steps = forms.MultipleChoiceField(
        choices=(), required=False, widget=forms.CheckboxSelectMultiple,
        label="Pipeline steps",
        help_text="Each ticked step adds LLM calls; the search and the answer always run. "
        "Point at a step for what it does.",
    )  # fmt: skip
    max_iterations = forms.IntegerField(
        min_value=1, max_value=10, initial=5, required=False, label="Loop turns",
        help_text="The most controller turns of the loop (1 to 10).",
    )  # fmt: skip

    def __init__(self, *args, collections=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["collection"].choices = [("", "All visible")] + [(n, n) for n in collections]
        self.fields["mode"].choices = modes = mode_choices()
        self.fields["mode"].initial = dashboard_mode(modes)
        self.groups = pipeline_choices()
        self.fields["steps"].choices = [c[:2] for _, choices in self.groups for c in choices]
        limit_query(self.fields["question"])

    def clean(self):
        data = super().clean()
        if not data.get("kind"):
            data["kind"] = "pipeline" if data.get("steps") else "ask"
        if not data.get("max_iterations"):
            data["max_iterations"] = 5
        return data

    def step_groups(self):
        """The steps' checkboxes in their groups, as ``(phase, title, boxes)``, for the
        template."""
        boxes = {box.data["value"]: box for box in self["steps"]}
        phases = {title: phase for phase, title in PHASES.items()}
        return [
            (phases[title], title, [(boxes[name], description) for name, _, description in choices])
            for title, choices in self.groups
        ]
