"""python -m services.admission: run admission until SIGTERM."""

from __future__ import annotations

from kestrel.service import run_main
from services.admission.app import AdmissionConfig, run


def main() -> None:
    run_main("admission", lambda stop: run(AdmissionConfig.from_env(), stop))


if __name__ == "__main__":
    main()
