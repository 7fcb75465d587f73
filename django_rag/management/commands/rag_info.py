import json

from django_rag import maintenance
from django_rag.conf import redact
from django_rag.management.progress import RagCommand
from django_rag.utils import plural


class Command(RagCommand):
    help = "Show the configuration (secrets redacted), the embedder, pgvector and counts."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **options):

        # info() redacts the settings; redacting the whole report again costs nothing and
        # covers any other value that could carry a credential (a model URL, a path).
        data = redact(maintenance.info())
        if options["json"]:
            self.stdout.write(json.dumps(data, indent=2, default=str))
            return
        embedder = data["embedder"]
        self.stdout.write(f"Embedder: {embedder['model']} ({embedder['dimensions']} dimensions)")
        self.stdout.write(f"EMBEDDING_DIMENSIONS: {data['embedding_dimensions']}")
        index = data["vector_index"]
        self.stdout.write(
            f"Vector index: {index['index'] or 'missing'} (VECTOR_INDEX_TYPE="
            f"{index['configured']!r}"
            + (")" if index["matches"] else "; rebuild it: manage.py rag_maintenance vector-index "
               "--apply)")
        )  # fmt: skip
        self.stdout.write(f"pgvector: {data['pgvector']}")
        work = data["background"]
        self.stdout.write(
            f"Background: {work['mode'] or 'unusable'} (BACKGROUND={work['setting']!r}): "
            f"{work['description']}"
        )
        if work.get("stalled_jobs"):
            self.stdout.write(
                f"  {work['stalled_jobs']} stalled job(s): retry them on the dashboard's jobs "
                "page or with manage.py rag_worker --requeue-stalled"
            )
        self.stdout.write("Chunks by embedding model:")
        for model, count in data["chunks_by_model"].items():
            self.stdout.write(f"  {model}: {count}")
        self.stdout.write("Collections:")
        for c in data["collections"]:
            self.stdout.write(
                f"  {c['name']}: {plural(c['documents'], 'document')}, {plural(c['chunks'], 'chunk')}"
            )
        self.stdout.write("Settings:")
        self.stdout.write(json.dumps(data["settings"], indent=2, default=str))
