from __future__ import annotations

import pytest

from tests.helpers import snapshot_template


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """A copy of the template as Copier reads it, shared by the whole session."""
    return snapshot_template(tmp_path_factory.mktemp("template"))
