"""The single-pass kernel's configs this experiment compiles and times (kernels/flash_attn/
backward_hopper.py): launch.HOPPER_BACKWARD takes hopper_bm128_strided_l2 at d=64 (128-row tiles without
a mask since session 9, under causal since session 10) and hopper_s2_strided_l2 at d=128 (the strided
descriptors since session 7: same kernel time on contiguous inputs, no copies of the model's views; the
heavy-first causal order since session 9), and launch.HOPPER_BACKWARD_WINDOW hopper_s2_hoist_strided_l2
at d=64 under a sliding window."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from kernels.flash_attn.launch import HopperConfig  # noqa: E402

HOPPER_VARIANTS = {
    "hopper_s2": HopperConfig(STAGES=2),
    "hopper_s3": HopperConfig(STAGES=3),
    "hopper_s2_hoist": HopperConfig(STAGES=2, REMAT_DESC=False),  # descriptors hoisted: spills at d=128
    # 128-row query tiles, FA3's d=64 tile (at d=128 they don't fit shared memory); no spills at d=64 full
    "hopper_bm128": HopperConfig(BLOCK_M=128, STAGES=2),
    # the same with the table's strided descriptors (session 6's one run of hopper_bm128 at d=64: 5.6 %
    # faster than 64 rows at full 8K, 1.3 % slower at full 32K; hoisting the descriptors as d=64's
    # table does spills 32-60 bytes at 128 rows, so they stay rebuilt in the loop)
    "hopper_bm128_strided": HopperConfig(BLOCK_M=128, STAGES=2, STRIDED=True),
    # the table's configs: 4-D descriptors over the inputs' strides (no copies; docs/perf-notes.md v8)
    "hopper_s2_strided": HopperConfig(STAGES=2, STRIDED=True),
    "hopper_s2_hoist_strided": HopperConfig(STAGES=2, REMAT_DESC=False, STRIDED=True),
    # causal: the heaviest key blocks of 32 MB head groups first (launch.HOPPER_BACKWARD's order
    # since session 9), against the (key blocks, heads, batch) grid order above
    "hopper_s2_hoist_strided_l2": HopperConfig(STAGES=2, REMAT_DESC=False, STRIDED=True, L2_GROUP_MB=32),
    "hopper_s2_strided_l2": HopperConfig(STAGES=2, STRIDED=True, L2_GROUP_MB=32),
    # FA3's 128-row tile (d=64 only) in the heavy-first causal order: launch.HOPPER_BACKWARD's d=64
    # config since session 10 (causal 8K 2.0 % faster than hopper_s2_hoist_strided_l2 in two runs)
    "hopper_bm128_strided_l2": HopperConfig(BLOCK_M=128, STAGES=2, STRIDED=True, L2_GROUP_MB=32),
}
