from django import forms
from django.core.validators import MaxLengthValidator

from ..conf import get_setting
from ..exceptions import InvalidInput
from ..validation import clean_filename

FORMATS = [("text", "Plain text"), ("markdown", "Markdown")]
MODES = [("semantic", "Semantic"), ("fulltext", "Full-text"), ("hybrid", "Hybrid")]
UPLOAD_TYPES = (".txt", ".md", ".markdown", ".pdf")


class IngestTextForm(forms.Form):
    collection = forms.CharField(max_length=255, initial="default")
    title = forms.CharField(max_length=500, required=False)
    source_id = forms.CharField(max_length=512, required=False)
    format = forms.ChoiceField(choices=FORMATS, initial="text")
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 8}))


class UploadForm(forms.Form):
    collection = forms.CharField(max_length=255, initial="default")
    file = forms.FileField()
    source_id = forms.CharField(
        max_length=512, required=False, help_text="Identifies the document across versions."
    )
    replace = forms.BooleanField(
        required=False, help_text="Replace the stored documents with the same source id."
    )

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = get_setting("DASHBOARD")["MAX_UPLOAD_BYTES"]
        if upload.size > limit:
            raise forms.ValidationError(f"The file is larger than {limit // (1024 * 1024)} MB.")
        if not upload.name.lower().endswith(UPLOAD_TYPES):
            raise forms.ValidationError("Upload a .txt, .md or .pdf file.")
        try:
            clean_filename(upload.name)
        except InvalidInput as exc:
            raise forms.ValidationError(str(exc)) from exc
        return upload


def limit_query(field: forms.CharField) -> None:
    """Bound a query/question field by MAX_QUERY_CHARS (read per form: never at import)."""
    limit = get_setting("MAX_QUERY_CHARS")
    field.max_length = limit
    field.validators.append(MaxLengthValidator(limit))
    field.widget.attrs["maxlength"] = str(limit)


class CollectionForm(forms.Form):
    name = forms.CharField(max_length=255)
    description = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)


class SearchForm(forms.Form):
    q = forms.CharField(label="Query", required=False)
    mode = forms.ChoiceField(choices=MODES, initial="hybrid", required=False)
    limit = forms.IntegerField(min_value=1, max_value=100, initial=10, required=False)
    collection = forms.MultipleChoiceField(choices=[], required=False)
    semantic_weight = forms.FloatField(min_value=0, required=False)
    fulltext_weight = forms.FloatField(min_value=0, required=False)
    compare = forms.BooleanField(required=False, label="Compare the three modes side by side")

    def __init__(self, *args, collections=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["collection"].choices = [(name, name) for name in collections]
        limit_query(self.fields["q"])


STEPS = [
    ("gate", "Gate"),
    ("rewrite", "Rewrite"),
    ("expand", "Expand"),
    ("decompose", "Decompose"),
    ("reason", "Reason"),
    ("rerank", "Rerank"),
    ("self_correct", "Self-correct"),
]


class AskForm(forms.Form):
    question = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}))
    collection = forms.ChoiceField(choices=[], required=False)
    mode = forms.ChoiceField(choices=MODES, initial="hybrid")
    limit = forms.IntegerField(min_value=1, max_value=20, initial=5)
    steps = forms.MultipleChoiceField(
        choices=STEPS, required=False, widget=forms.CheckboxSelectMultiple,
        label="Agentic steps (none: a single ask)",
    )  # fmt: skip

    def __init__(self, *args, collections=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["collection"].choices = [("", "All visible")] + [(n, n) for n in collections]
        limit_query(self.fields["question"])
