from django import forms

from ..conf import get_setting

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

    def clean_file(self):
        upload = self.cleaned_data["file"]
        limit = get_setting("DASHBOARD")["MAX_UPLOAD_BYTES"]
        if upload.size > limit:
            raise forms.ValidationError(f"The file is larger than {limit // (1024 * 1024)} MB.")
        if not upload.name.lower().endswith(UPLOAD_TYPES):
            raise forms.ValidationError("Upload a .txt, .md or .pdf file.")
        return upload


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
