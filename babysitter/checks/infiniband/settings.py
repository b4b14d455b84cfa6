"""`[checks.infiniband]`: what the InfiniBand check reads (config.py assembles it into `Config`).

The defaults of the flap rules, and where they come from:

- `port_down_hold_s`: NCCL's InfiniBand retry budget at NCCL's defaults. A message the link
  lost is resent after the queue pair's local ACK timeout, 4.096 us x 2^NCCL_IB_TIMEOUT
  (InfiniBand spec vol. 1, 12.7.34 "Local Ack Timeout"), NCCL_IB_RETRY_CNT times (12.7.38)
  before the queue pair errors and the job's NCCL gives up. NCCL's defaults:
  `NCCL_PARAM(IbTimeout, "IB_TIMEOUT", 20)` and `NCCL_PARAM(IbRetryCnt, "IB_RETRY_CNT", 7)`
  (github:NVIDIA/nccl src/transport/net_ib/connect.cc@5067397c; net_ib.cc before 2.29;
  NCCL_IB_TIMEOUT was 18 from 2.14 and 14 before, a shorter budget). NCCL's own figure is the
  product, 7 x 4.3 s: "the default values of NCCL_IB_TIMEOUT=20 and NCCL_IB_RETRY_CNT=7 result
  in approximately 30 seconds of waiting (7 retries, each lasting 4.3 seconds)"
  (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html, NCCL_IB_RETRY_CNT).
  Counting the first send too, the queue pair errors at 8 x 4.3 = 34.4 s at the earliest: the
  hold ends at NCCL's 30 s, before that, so that a port down for good is drained while the job
  still runs and its requeue is held and then done (controller/loop/decide/link_hold.py; a job that
  failed before the drain is not one `jobs.babysat_on` lists). A port back within it is a flap
  the job's NCCL rode out: a warning, no drain.
- `flap_count` in `flap_window_s`: 2 in 300 s, ByteRobust's rule for a network alert (it
  evicts a machine only when the alert fires twice within 5 minutes; Wan et al., "Robust LLM
  Training Infrastructure at ByteDance", arXiv:2509.16293).
"""

from typing import Annotated

from msgspec import Meta

from babysitter.settings import CheckConfig

NCCL_IB_TIMEOUT = 20  # NCCL's default since 2.23 (18 since 2.14, 14 before)
NCCL_IB_RETRY_CNT = 7  # NCCL's default (the InfiniBand maximum)
IB_ACK_TIMEOUT_UNIT_S = 4.096e-6  # InfiniBand spec vol. 1, 12.7.34
# 4.096 us x 2^20 x 7 = 30.06 s (NCCL's "approximately 30 seconds")
NCCL_IB_RETRY_BUDGET_S = round(IB_ACK_TIMEOUT_UNIT_S * 2**NCCL_IB_TIMEOUT * NCCL_IB_RETRY_CNT, 2)
FLAP_COUNT = 2  # ByteRobust: a network alert twice...
FLAP_WINDOW_S = 300.0  # ...within 5 minutes


class InfinibandCheckConfig(CheckConfig):
    expected_ports: (
        Annotated[
            int, Meta(ge=0, description="ACTIVE ports expected (default: the hardware profile's)")
        ]
        | None
    ) = None
    expected_rate_gbps: (
        Annotated[
            float,
            Meta(gt=0, description="rate each port must have (default: the hardware profile's)"),
        ]
        | None
    ) = None
    flap_recovery_s: (
        Annotated[
            float,
            Meta(gt=0, description="opt-in: forgive flaps after the port is stable this long"),
        ]
        | None
    ) = None
    port_down_hold_s: Annotated[
        float,
        Meta(
            ge=0,
            description="a port down this long drains the node; back sooner it was a flap (a "
            "warning). Default: NCCL's IB retry budget at its defaults, 4.096 us x "
            "2^NCCL_IB_TIMEOUT(20) x NCCL_IB_RETRY_CNT(7); 0: drain at once",
        ),
    ] = NCCL_IB_RETRY_BUDGET_S
    flap_count: Annotated[
        int,
        Meta(
            ge=1,
            description="flaps of one port within flap_window_s that drain the node "
            "(ib.port_flapping; default: ByteRobust's twice in 5 minutes)",
        ),
    ] = FLAP_COUNT
    flap_window_s: Annotated[
        float, Meta(gt=0, description="the window flap_count flaps must fall in")
    ] = FLAP_WINDOW_S
