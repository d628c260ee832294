"""oneDNN-packed linear weights on CPU: float32 layers are packed (and serve every batch size), and a packed layer
gives the plain kernel's results."""
from __future__ import annotations

import pytest
import torch

from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.models.layers import Linear, Slice, packed_serves
from toolkit.runtime.server_args import ServerArgs
from tests.runtime.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


@pytest.mark.parametrize("name", ["llama-gqa-llama3rope", "llama-tied-linearrope"])
def test_a_float32_model_on_cpu_gets_packed_weights(name, tmp_path):
    make_tiny_model(name, tmp_path)
    runner = ModelRunner(ServerArgs(model_path=str(tmp_path), dtype="float32", device="cpu",
                                    max_total_tokens=1024, max_running_requests=4))
    linears = [m for m in runner.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed_weight is not None for m in linears)
    assert (runner.model.packed_tied_head is not None) == (runner.model.lm_head is None)


@pytest.mark.parametrize("rows", [1, 64, 700])
def test_a_packed_float32_layer_equals_the_plain_kernel_at_any_batch(rows):
    torch.manual_seed(0)
    layer = Linear(96, {"": Slice.whole(160)}, bias=True)
    x = torch.randn(rows, 96)
    with torch.no_grad():
        plain = layer(x)
        layer.packed_weight = torch.ops.mkldnn._reorder_linear_weight(layer.weight, 64)
        packed = layer(x)
    assert packed_serves(x), "float32 uses the packed weight above the bf16 row limit too"
    torch.testing.assert_close(packed, plain, rtol=1e-5, atol=1e-5)


def test_bf16_rows_above_the_limit_take_the_plain_kernel():
    assert packed_serves(torch.empty(512, 8, dtype=torch.bfloat16))
    assert not packed_serves(torch.empty(513, 8, dtype=torch.bfloat16))
