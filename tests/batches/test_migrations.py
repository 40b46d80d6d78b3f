"""The move of file contents into chunks, both ways, on a real PostgreSQL.

It runs inside the test's transaction (PostgreSQL's DDL is transactional): whatever it
migrates is rolled back with the test.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db

BEFORE = [("batches", "0004_batch_stepped_at")]
AFTER = [("batches", "0005_file_chunks")]


def _migrate(targets: list[tuple[str, str]]) -> MigrationExecutor:
    with connection.cursor() as cursor:
        # Rows written in this transaction leave deferred checks pending, which ALTER TABLE
        # refuses to run over.
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return MigrationExecutor(connection)


def test_file_contents_move_into_chunks_and_back(world):
    old = _migrate(BEFORE).loader.project_state(BEFORE).apps.get_model("batches", "File")
    content = bytes(range(256)) * (3 * 4096 + 17)  # three chunks of 1 MiB and a bit
    common = {"tenant_id": world.acme.pk, "purpose": "batch", "filename": "f", "lines": 1}
    old.objects.create(id="file-big", size=len(content), content=content, **common)
    old.objects.create(id="file-one", size=3, content=b"{}\n", **common)

    new = _migrate(AFTER).loader.project_state(AFTER).apps.get_model("batches", "FileChunk")
    chunks = new.objects.filter(file_id="file-big").order_by("seq")
    assert [c.seq for c in chunks] == [0, 1, 2, 3]
    assert [len(c.data) for c in chunks] == [1024 * 1024] * 3 + [len(content) - 3 * 1024 * 1024]
    assert b"".join(bytes(c.data) for c in chunks) == content
    assert [bytes(c.data) for c in new.objects.filter(file_id="file-one")] == [b"{}\n"]

    back = _migrate(BEFORE).loader.project_state(BEFORE).apps.get_model("batches", "File")
    assert bytes(back.objects.get(pk="file-big").content) == content
    assert bytes(back.objects.get(pk="file-one").content) == b"{}\n"
    _migrate(AFTER)
