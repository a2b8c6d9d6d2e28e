from __future__ import annotations

import pytest
import torch

from tests.helpers import snapshot_template


@pytest.fixture(scope="session")
def template(tmp_path_factory):
    """A copy of the template as Copier reads it, shared by the whole session."""
    return snapshot_template(tmp_path_factory.mktemp("template"))


@pytest.fixture(autouse=True, scope="session")
def one_thread_per_worker():
    """Tests run two at a time on two cores: more threads would only fight."""
    torch.set_num_threads(1)
