"""`python -m services.worker`: one replica of the endpoint KESTREL_WORKER_ENDPOINT."""

from kestrel.service import run_main
from services.worker.app import WorkerConfig, run


def main() -> None:
    config = WorkerConfig.from_env()
    run_main("worker", lambda stop: run(config, stop))


if __name__ == "__main__":
    main()
