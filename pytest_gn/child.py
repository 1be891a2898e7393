"""`python -m pytest_gn.child`: run one foreign-implementation case, print its result as JSON.

Reads {"case", "impl", "seed", "device"} from stdin. Lives in its own process so that an
implementation that aborts (device-side assert, segfault) cannot take the pytest session down.
Prints a phase line before the forward, the backward and the reference, so the parent can say
where a process that died was.
"""

from __future__ import annotations

import json
import sys
import traceback
from dataclasses import asdict


def main() -> int:
    from pytest_gn.runner import PHASE_TAG, RESULT_TAG, CaseResult, case_from_json, check_case, load_impl

    def phase(name: str) -> None:
        print(PHASE_TAG + name, flush=True)

    request = json.loads(sys.stdin.read())
    try:
        import torch

        device = request["device"]
        if device != "cpu":
            torch.cuda.set_device(int(device))
        case = case_from_json(request["case"])
        result = check_case(
            case, load_impl(request["impl"]), int(request["seed"]), "cpu" if device == "cpu" else None, phase
        )
        if torch.cuda.is_available():
            torch.cuda.synchronize()  # surface asynchronous device errors inside this case
    except Exception as exc:  # report the failure as data: the parent shows it as a failed case
        traceback.print_exc()
        result = CaseResult(False, [f"{type(exc).__name__}: {exc}"])
    data = asdict(result)
    data.pop("stderr")
    print(RESULT_TAG + json.dumps(data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
