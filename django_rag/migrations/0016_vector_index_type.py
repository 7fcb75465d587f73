"""The chunk vectors' HNSW index of the type ``VECTOR_INDEX_TYPE`` names.

A fresh database gets it from 0001 (``EmbeddingIndex`` reads the setting when it is created).
A database migrated before the setting existed has a ``vector`` index: when the setting says
``"halfvec"`` this migration rebuilds it as the expression index over
``embedding::halfvec(n)``; when it says ``"vector"`` (the default) it does nothing. Changing the
setting later needs ``manage.py rag_maintenance vector-index --apply`` (system check
``django_rag.W007`` says so), which builds the new index concurrently.
"""

from django.db import migrations


def sync(apps, schema_editor):
    from django_rag.store.schema import index_state, rebuild_index

    connection = schema_editor.connection
    state = index_state(connection)
    if state["dimensions"] is not None and not state["matches"]:
        rebuild_index(connection)


class Migration(migrations.Migration):
    dependencies = [("django_rag", "0015_conversations")]

    operations = [migrations.RunPython(sync, migrations.RunPython.noop, elidable=False)]
