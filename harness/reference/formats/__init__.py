"""Pure-PyTorch reference quantizers for the formats TE trains with.

* :mod:`.fp8`    -- per-tensor FP8 (E4M3/E5M2), delayed and current scaling
* :mod:`.block`  -- FP8 with per-block fp32 scales (TE ``Float8BlockScaling``)
* :mod:`.mxfp8`  -- OCP MXFP8: 32-element blocks with E8M0 scales
* :mod:`.nvfp4`  -- NVFP4: E2M1 packed pairs, 16-element E4M3 block scales, fp32 global scale

All quantized payloads (elements and non-fp32 scales) are ``torch.uint8`` bit
patterns so they can be compared bytewise. Functions are device-agnostic.
"""

from harness.reference.formats import block, fp8, mxfp8, nvfp4

__all__ = ["fp8", "block", "mxfp8", "nvfp4"]
