"""The extractors that need no LLM: named entities from a transformers model (``"ner"``) or a
spaCy pipeline (``"spacy"``), capitalised phrases (``"capitalized"``) and co-occurrence
relationships (``"cooccurrence"``)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

from ..conf import graph_setting
from ..embeddings.loading import load_model
from ..exceptions import (
    ConfigurationError,
    MissingDependency,
    MissingModel,
)
from ..signals import span
from .extraction import (
    NER_TYPES,
    EntityExtractor,
    ExtractedEntity,
    ExtractedRelationship,
    RelationshipExtractor,
    dedupe_entities,
)
from .names import normalize_name


class NEREntityExtractor(EntityExtractor):
    """A transformers token-classification model (default ``dslim/distilbert-NER``).

    Loaded lazily, once per process; any model name or local path. Labels PER/ORG/LOC/MISC
    become person/organization/location/concept.
    """

    def __init__(
        self,
        *,
        model: str = "dslim/distilbert-NER",
        device: str | int | None = None,
        min_score: float = 0.5,
        batch_size: int = 8,
    ):
        self.model_name = model
        self.device = device
        self.min_score = min_score
        self.batch_size = batch_size

    @property
    def pipeline(self):
        def load():
            try:
                from transformers import pipeline
            except ImportError as exc:
                raise MissingDependency("transformers", "local", "The NER extractor") from exc
            return pipeline(
                "token-classification",
                model=self.model_name,
                aggregation_strategy="first",
                device=self.device,
            )

        return load_model(
            ("ner", self.model_name, self.device), load, model=self.model_name, kind="ner"
        )

    def extract(self, text: str) -> list[ExtractedEntity]:
        if not text.strip():
            return []
        with span("graph.ner", text=text) as s:
            entities = []
            for item in self.pipeline(text, batch_size=self.batch_size):
                if float(item.get("score", 1.0)) < self.min_score:
                    continue
                label = str(item.get("entity_group") or item.get("entity") or "")
                label = label.split("-", 1)[-1]
                name = str(item.get("word") or "").strip()
                if name:
                    entities.append(
                        ExtractedEntity(
                            name,
                            NER_TYPES.get(label, "other"),
                            span_start=item.get("start"),
                            span_end=item.get("end"),
                        )
                    )
            entities = dedupe_entities(entities)
            s.set(entity_count=len(entities))
            return entities


#: spaCy's entity labels (OntoNotes, as in ``en_core_web_*``) as django_rag entity types.
SPACY_TYPES = {
    "PERSON": "person",
    "ORG": "organization",
    "GPE": "location",
    "LOC": "location",
    "FAC": "location",
    "NORP": "concept",
    "EVENT": "event",
    "PRODUCT": "product",
    "WORK_OF_ART": "publication",
    "LAW": "publication",
    "LANGUAGE": "concept",
}
#: Labels left out by default: dates, amounts and ordinals become hubs that join unrelated
#: chunks ("1975", "two") instead of naming things a question is about.
SPACY_SKIPPED = ("DATE", "TIME", "PERCENT", "MONEY", "QUANTITY", "ORDINAL", "CARDINAL")


class SpacyEntityExtractor(EntityExtractor):
    """Named entities from a spaCy pipeline (``GRAPH["SPACY_MODEL"]``, default
    ``en_core_web_sm``).

    Loaded lazily, once per process, with only the components NER needs. ``labels`` limits
    the entity labels kept (default: every label but dates, times, amounts and ordinals).
    Without spaCy it raises :class:`~django_rag.exceptions.MissingDependency` (extra
    ``ner``); without the model, :class:`~django_rag.exceptions.MissingModel` with the command
    that installs it.
    """

    #: Pipeline components NER does not use (turned off when present).
    UNUSED = ("parser", "tagger", "lemmatizer", "attribute_ruler", "senter")

    def __init__(self, *, model: str | None = None, labels: Sequence[str] | None = None):
        self.model = model
        self.labels = set(labels) if labels is not None else None

    @property
    def model_name(self) -> str:
        return self.model or graph_setting("SPACY_MODEL")

    @property
    def nlp(self):
        name = self.model_name

        def load():
            try:
                import spacy
            except ImportError as exc:
                raise MissingDependency("spacy", "ner", "The spaCy entity extractor") from exc
            try:
                nlp = spacy.load(name)
            except OSError as exc:
                raise MissingModel(
                    name,
                    "The spaCy entity extractor",
                    f"python -m spacy download {name}",
                    "GRAPH.SPACY_MODEL",
                ) from exc
            if "ner" not in nlp.pipe_names:
                raise ConfigurationError(
                    "GRAPH.SPACY_MODEL", name, "the spaCy pipeline has no 'ner' component"
                )
            for component in self.UNUSED:
                if component in nlp.pipe_names:
                    nlp.disable_pipe(component)
            return nlp

        return load_model(("spacy", name), load, model=name, kind="ner", hugging_face=False)

    def _keep(self, label: str) -> bool:
        if self.labels is not None:
            return label in self.labels
        return label not in SPACY_SKIPPED

    def extract(self, text: str) -> list[ExtractedEntity]:
        if not text.strip():
            return []
        nlp = self.nlp
        with span("graph.ner", text=text, model=self.model_name) as s:
            # spaCy refuses texts over nlp.max_length; a chunk never comes near it, so a longer
            # text is cut there rather than failing the build.
            doc = nlp(text[: nlp.max_length])
            entities = [
                ExtractedEntity(
                    ent.text.strip(),
                    SPACY_TYPES.get(ent.label_, "other"),
                    span_start=ent.start_char,
                    span_end=ent.end_char,
                )
                for ent in doc.ents
                if self._keep(ent.label_) and ent.text.strip()
            ]
            entities = dedupe_entities(entities)
            s.set(entity_count=len(entities))
            return entities


# Words joined by spaces or tabs only (never across a line break: a heading is not part of
# the next paragraph's name), with at most one connector word between them. The separators
# cannot overlap, so matching stays linear on long runs of whitespace.
_CAP_WORD = r"(?:[A-Z][\w'’.-]*[A-Za-z0-9]|[A-Z]{2,}[0-9]*)"
_CAPITALIZED = re.compile(
    rf"\b{_CAP_WORD}(?:[ \t]+(?:(?:of|de|la|von|van|for|and|&)[ \t]+)?{_CAP_WORD})*"
)


def _char_before(text: str, position: int) -> str:
    """The last non-space character before ``position`` ("" at the start). Walks back over
    the spaces only, so the extractor stays linear (slicing the text before every match
    copied it each time)."""
    position -= 1
    while position >= 0 and text[position].isspace():
        position -= 1
    return text[position] if position >= 0 else ""


class CapitalizedEntityExtractor(EntityExtractor):
    """No model at all: runs of capitalised words and acronyms (``New York City``, ``IL-6``).

    A sentence's first word counts only when it is an acronym or part of a longer run.
    Fast and offline; noisier than NER.
    """

    def __init__(self, *, min_length: int = 2, stopwords: Sequence[str] = ()):
        self.min_length = min_length
        self.stopwords = {w.lower() for w in stopwords} | {
            "the", "a", "an", "this", "that", "these", "those", "in", "on", "at", "we", "it",
            "our", "for", "of", "and", "but", "however", "here", "there", "when", "while",
        }  # fmt: skip

    def extract(self, text: str) -> list[ExtractedEntity]:
        entities = []
        for match in _CAPITALIZED.finditer(text):
            name = match.group(0).strip(" .,'’-")
            words = name.split()
            sentence_start = _char_before(text, match.start()) in ".!?:\n"
            if sentence_start and len(words) == 1 and not name.isupper():
                continue
            if words and words[0].lower() in self.stopwords:
                name = " ".join(words[1:])
            if len(name) >= self.min_length and name.lower() not in self.stopwords:
                entities.append(
                    ExtractedEntity(name, "other", span_start=match.start(), span_end=match.end())
                )
        return dedupe_entities(entities)


class CooccurrenceRelationshipExtractor(RelationshipExtractor):
    """No LLM: entities mentioned in the same chunk are ``CO_OCCURS_WITH`` each other.

    ``window`` (characters) limits pairs to entities mentioned close together when spans are
    known; ``max_entities`` bounds the pairs of very entity-dense chunks.
    """

    def __init__(self, *, window: int | None = None, max_entities: int = 20):
        self.window = window
        self.max_entities = max_entities

    def extract(self, text, entities):
        chosen = list(entities)[: self.max_entities]
        relationships = []
        for a, b in itertools.combinations(chosen, 2):
            if self.window is not None and None not in (a.span_start, b.span_start):
                if abs(a.span_start - b.span_start) > self.window:
                    continue
            first, second = sorted((a, b), key=lambda e: normalize_name(e.name))
            relationships.append(ExtractedRelationship(first.name, second.name, "CO_OCCURS_WITH"))
        return relationships
