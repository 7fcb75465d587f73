"""The pg_textsearch BM25 index on the chunk text, where the database can have one.

Created only when the ``pg_textsearch`` extension is installed in the database, or can be
(available on the server with its library preloaded: then the extension is created too), and
``SEARCH["FULLTEXT_BACKEND"]`` is not ``"sql"``. On every other server, plain pgvector ones
included, this migration does nothing. Running it again later (``migrate django_rag 0008`` then
``migrate django_rag``) builds the index once the extension has been installed.
"""

from django.db import migrations


def create(apps, schema_editor):
    from django_rag.models.textsearch import create_index

    create_index(schema_editor.connection)


def drop(apps, schema_editor):
    from django_rag.models.textsearch import drop_index

    drop_index(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0009_job_heartbeat")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
