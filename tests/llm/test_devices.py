"""``ragrl.llm.devices``: a device is checked by name before anything is loaded onto it."""

import pytest
import torch

from ragrl.errors import RagrlError
from ragrl.llm.devices import resolve_device
from ragrl.retrieval.dense import resolve_device as encoder_device


def test_auto_and_cpu_and_a_torch_device_pass():
    assert (
        resolve_device("auto")
        == resolve_device(None)
        == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("meta")) == torch.device("meta")  # a caller's own device stays
    assert encoder_device("cpu") == "cpu"


def test_a_name_torch_does_not_know_is_named():
    for check in (resolve_device, encoder_device):
        with pytest.raises(
            RagrlError, match=r"device 'banana': not a device name \(auto, cpu, cuda, cuda:N\)"
        ):
            check("banana")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU's refusal")
def test_cuda_without_a_gpu_is_refused_before_loading():
    for name in ("cuda", "cuda:1"):
        with pytest.raises(
            RagrlError, match=rf"device '{name}': this torch \(.*\) sees no CUDA GPU; use cpu"
        ):
            resolve_device(name)
