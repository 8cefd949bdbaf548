import pytest
import torch


@pytest.fixture(autouse=True)
def one_intra_op_thread():
    """The models here are tiny: one thread is as fast as two and leaves the second core to other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
