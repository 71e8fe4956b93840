"""make cluster-check: the data plane's acceptance check and bare-Kueue baseline.

1. Brings the cluster up if needed (kestrel_tools.cluster.ensure_cluster). Idle resident
   memory of the data plane processes (etcd, kube-apiserver, kube-controller-manager,
   kube-scheduler, kwok-controller, kueue) is taken after the checks, with no jobs.
2. Quota checks against real Kueue: in a tenant ClusterQueue with 8 H100 GPUs, an
   8-GPU Job is admitted on flavor gpu-h100, its pod lands on an H100 KWOK node and
   Succeeds; a second 8-GPU Job submitted meanwhile gets no quota until the first has
   finished, then is admitted.
3. The CPU pool (the real kubelet node, issue 12): a Job in the Kestrel image goes
   through Kueue (flavor cpu) to kestrel-cpu-0, really runs, and prints what only
   that container can know (its own cgroup path, with its pod uid and container id)
   and the model file's sha256; its exit code and log are read back. The image build
   (images/build.sh, cached by input hash) is timed first: image_build_s is 0 when
   every stage came from the cache.
4. Also runs tests/e2e/test_cluster.py (pytest) unless --skip-e2e.
5. Baseline: K Jobs (1 GPU, short duration) submitted straight to Kueue with the
   kubernetes client into a ClusterQueue whose quota equals the GPU pool (64 GPUs),
   so admissions are bounded by real quota being released as jobs finish, like
   Kueue's own performance baseline. Admission instants are taken from a watch on
   the Workloads. The jobs are deleted afterwards.

Last line: ``cluster: kubernetes=... kueue=... kwok=... gpu_nodes=N gpus=N
admitted_within_quota=B held_over_quota=B kueue_admit_per_s=X idle_rss_mib=N
cpu_nodes=N cpu_pod_ran=B image_build_s=X``
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kestrel_tools import cluster as kc
from kestrel_tools import kubework as kw

WAIT_S = 300.0


def log(msg: str) -> None:
    print(msg, flush=True)


def k8s() -> Any:
    from kubernetes import client

    return client


def wait_for(what: str, fn: Any, timeout_s: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)


def job_state(api: Any, ns: str, name: str) -> str | None:
    job = k8s().BatchV1Api(api).read_namespaced_job_status(name, ns)
    for cond in job.status.conditions or []:
        if cond.type in ("Complete", "Failed") and cond.status == "True":
            return str(cond.type)
    return None


def cpu_pool_check(api: Any) -> tuple[int, bool]:
    """Returns (Ready real CPU nodes, whether a Kueue-admitted pod really ran on one)."""
    nodes = k8s().CoreV1Api(api).list_node(label_selector=kc.CPU_NODE_SELECTOR).items
    ready = [n for n in nodes
             if any(c.type == "Ready" and c.status == "True" for c in n.status.conditions)]
    log(f"  real CPU nodes Ready: {[n.metadata.name for n in ready]}")
    if not ready:
        return 0, False
    ns = f"check-cpu-{uuid.uuid4().hex[:6]}"
    kw.create_tenant_queue(api, kw.tenant_queue_manifests(
        ns, gpu_quota={}, cpu_quota={"cpu": "1", "memory": "1Gi"}))
    try:
        script = ("echo cgroup=$(grep -m1 pids /proc/self/cgroup | cut -d: -f3); "
                  "echo model_sha256=$(sha256sum /opt/kestrel/model/model.onnx | cut -d' ' -f1); "
                  "echo image=$KESTREL_MODEL_DIR; exit 0")
        t0 = time.monotonic()
        run = kw.run_cpu_job(api, ns, "gpu", "probe", ["sh", "-c", script], timeout_s=WAIT_S)
        took = time.monotonic() - t0
        for line in run.log.splitlines():
            log(f"  pod {run.pod} says: {line}")
        cgroup = next((ln.split("=", 1)[1] for ln in run.log.splitlines()
                       if ln.startswith("cgroup=")), "")
        ran = (run.exit_code == 0 and run.flavor == kc.CPU_FLAVOR and run.node in
               {n.metadata.name for n in ready}
               and bool(run.pod_uid) and run.pod_uid in cgroup
               and bool(run.container_id) and run.container_id in cgroup
               and f"model_sha256={kw.MODEL_ONNX_SHA256}" in run.log)
        log(f"  probe: admitted on flavor {run.flavor!r}, node {run.node}, exit code "
            f"{run.exit_code}, cgroup names pod {run.pod_uid in cgroup} and container "
            f"{bool(run.container_id) and run.container_id in cgroup}; {took:.1f}s "
            f"submit to end -> cpu_pod_ran={str(ran).lower()}")
        return len(ready), ran
    finally:
        kw.delete_tenant_queue(api, ns)


def quota_checks(api: Any) -> tuple[bool, bool]:
    """Returns (admitted_within_quota, held_over_quota)."""
    ns = f"check-{uuid.uuid4().hex[:6]}"
    batch = k8s().BatchV1Api(api)
    core = k8s().CoreV1Api(api)
    kw.create_tenant_queue(api, kw.tenant_queue_manifests(ns, gpu_quota={"gpu-h100": 8}))
    admitted_ok = held_ok = False
    try:
        first = batch.create_namespaced_job(
            ns, cast(Any, kw.gpu_job_manifest("first", ns, "gpu", gpus=8, duration_s=15))
        )
        wl = wait_for(
            "first admitted",
            lambda: (
                (w := kw.workloads_by_job_uid(api, ns).get(first.metadata.uid))
                and kw.condition_true(w, "Admitted")
                and w
            ),
        )
        flavor = wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"]
        log(f"  first: admitted by ClusterQueue {ns} on flavor {flavor}")

        second = batch.create_namespaced_job(
            ns, cast(Any, kw.gpu_job_manifest("second", ns, "gpu", gpus=8, duration_s=1))
        )
        held = wait_for(
            "second evaluated",
            lambda: (
                (w := kw.workloads_by_job_uid(api, ns).get(second.metadata.uid))
                and kw.condition(w, "QuotaReserved") is not None
                and w
            ),
        )
        held_msg = (kw.condition(held, "QuotaReserved") or {}).get("message", "")
        held_ok = not kw.condition_true(held, "QuotaReserved")
        log(f"  second: QuotaReserved={not held_ok} ({held_msg})")
        observations = 0
        while not job_state(api, ns, "first"):
            w = kw.workloads_by_job_uid(api, ns)[second.metadata.uid]
            if kw.condition_true(w, "QuotaReserved"):
                held_ok = False
            observations += 1
            time.sleep(0.5)
        held_ok = held_ok and observations > 0
        pods = core.list_namespaced_pod(ns, label_selector="job-name=first").items
        node = core.read_node(pods[0].spec.node_name) if pods else None
        first_state = job_state(api, ns, "first")
        admitted_ok = (
            flavor == "gpu-h100"
            and first_state == "Complete"
            and len(pods) == 1
            and pods[0].status.phase == "Succeeded"
            and node is not None
            and node.metadata.labels.get("kestrel.dev/flavor") == "gpu-h100"
        )
        log(
            f"  first: {first_state} on node {pods[0].spec.node_name if pods else None}; "
            f"second held while first ran ({observations} observations): {held_ok}"
        )
        second_wl = wait_for(
            "second admitted after first finished",
            lambda: (
                (w := kw.workloads_by_job_uid(api, ns).get(second.metadata.uid))
                and kw.condition_true(w, "Admitted")
                and w
            ),
        )
        first_wl = kw.workloads_by_job_uid(api, ns)[first.metadata.uid]
        fin = (kw.condition(first_wl, "Finished") or {}).get("lastTransitionTime", "")
        res = (kw.condition(second_wl, "QuotaReserved") or {}).get("lastTransitionTime", "")
        held_ok = held_ok and bool(fin) and res >= fin  # RFC3339 UTC strings compare in order
        log(f"  second: quota reserved at {res}, first finished at {fin}")
        wait_for("second finished", lambda: job_state(api, ns, "second"))
    finally:
        kw.delete_tenant_queue(api, ns)
    return admitted_ok, held_ok


def run_e2e_tests() -> bool:
    """Run the data plane's e2e tests (pinned version, admission, hold, placement)."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         str(root / "tests" / "e2e" / "test_cluster.py")],
        cwd=root, capture_output=True, text=True, check=False,
    )  # fmt: skip
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    for line in lines if proc.returncode else lines[-1:]:
        log(f"  {line}")
    return proc.returncode == 0


def watch_admissions(
    api: Any, ns: str, seen: dict[str, float], target: int, stop: threading.Event
) -> None:
    """Record the first instant each Workload in ``ns`` is seen Admitted."""
    from kubernetes import watch

    watch_mod: Any = watch  # kubernetes.watch has no type hints
    custom = k8s().CustomObjectsApi(api)
    while not stop.is_set() and len(seen) < target:
        listing = custom.list_namespaced_custom_object(
            kw.KUEUE_GROUP, kw.KUEUE_API_VERSION, ns, "workloads"
        )
        now = time.monotonic()
        for wl in listing["items"]:
            if kw.condition_true(wl, "Admitted"):
                seen.setdefault(wl["metadata"]["uid"], now)
        w = watch_mod.Watch()
        for event in w.stream(
            custom.list_namespaced_custom_object,
            kw.KUEUE_GROUP,
            kw.KUEUE_API_VERSION,
            ns,
            "workloads",
            resource_version=listing["metadata"]["resourceVersion"],
            timeout_seconds=30,
        ):
            obj = event["object"]
            if kw.condition_true(obj, "Admitted"):
                seen.setdefault(obj["metadata"]["uid"], time.monotonic())
            if stop.is_set() or len(seen) >= target:
                w.stop()
                break


NOOP_CHECK = "kestrel-bench-noop"


def steady_rate(times: list[float]) -> float:
    """Admissions per second between the 20th and the 90th percent of them: the
    rate once the start-up burst (every Job created at once) has passed."""
    lo, hi = int(0.2 * len(times)), int(0.9 * len(times)) - 1
    if hi <= lo:
        return 0.0
    return (hi - lo) / max(times[hi] - times[lo], 1e-3)


def _approve(custom: Any, wl: dict[str, Any], check: str) -> None:
    entries = (wl.get("status") or {}).get("admissionChecks") or []
    for i, entry in enumerate(entries):
        if entry.get("name") == check and entry.get("state") != "Ready":
            at = f"/status/admissionChecks/{i}"
            ops = [{"op": "test", "path": f"{at}/name", "value": check},
                   {"op": "replace", "path": f"{at}/state", "value": "Ready"},
                   {"op": "add", "path": f"{at}/message", "value": "no-op check"}]
            # Refused when the list moved meanwhile: the next event or relist answers it.
            with contextlib.suppress(Exception):
                custom.patch_namespaced_custom_object_status(
                    kw.KUEUE_GROUP, kw.KUEUE_API_VERSION, wl["metadata"]["namespace"],
                    "workloads", wl["metadata"]["name"], ops,
                    _content_type="application/json-patch+json")


def noop_check_controller(api: Any, ns: str, check: str, stop: threading.Event) -> None:
    """An AdmissionCheck controller that decides nothing: every Workload in ``ns`` that
    waits on ``check`` is set Ready as soon as it is seen. Run against the same jobs,
    it measures what Kueue's admission-check protocol costs by itself (the extra
    Workload status writes and the wait for a controller), apart from Kestrel."""
    from kubernetes import watch

    watch_mod: Any = watch
    custom = k8s().CustomObjectsApi(api)
    while not stop.is_set():
        try:
            listing = custom.list_namespaced_custom_object(
                kw.KUEUE_GROUP, kw.KUEUE_API_VERSION, ns, "workloads")
            for wl in listing["items"]:
                _approve(custom, wl, check)
            w = watch_mod.Watch()
            for event in w.stream(custom.list_namespaced_custom_object, kw.KUEUE_GROUP,
                                  kw.KUEUE_API_VERSION, ns, "workloads",
                                  resource_version=listing["metadata"]["resourceVersion"],
                                  timeout_seconds=5):  # then relist: nothing is missed
                if event["type"] in ("ADDED", "MODIFIED"):
                    _approve(custom, event["object"], check)
                if stop.is_set():
                    w.stop()
                    break
        except Exception:
            time.sleep(0.2)


def _ensure_noop_check(api: Any) -> None:
    from kubernetes.client.exceptions import ApiException

    custom = k8s().CustomObjectsApi(api)
    body = {"apiVersion": f"{kw.KUEUE_GROUP}/{kw.KUEUE_API_VERSION}", "kind": "AdmissionCheck",
            "metadata": {"name": NOOP_CHECK},
            "spec": {"controllerName": "kestrel.dev/bench-noop"}}
    try:
        custom.create_cluster_custom_object(kw.KUEUE_GROUP, kw.KUEUE_API_VERSION,
                                            "admissionchecks", body)
    except ApiException as exc:
        if exc.status != 409:
            raise
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    custom.patch_cluster_custom_object_status(
        kw.KUEUE_GROUP, kw.KUEUE_API_VERSION, "admissionchecks", NOOP_CHECK,
        {"status": {"conditions": [{"type": "Active", "status": "True", "reason": "Active",
                                    "message": "bench no-op controller",
                                    "lastTransitionTime": stamp}]}})


def bench(api: Any, jobs: int, duration_s: int, workers: int, gpus_total: int,
          noop_check: bool = False,
          on_admitted: Callable[[], object] | None = None) -> dict[str, float]:
    """K jobs straight to Kueue; with ``noop_check`` the ClusterQueue also carries an
    AdmissionCheck answered Ready at once by :func:`noop_check_controller`.
    ``on_admitted`` is called once the last is admitted, before the clean-up."""
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    flavors = {"gpu-h100": gpus_total // 2, "gpu-a10": gpus_total - gpus_total // 2}
    manifests = kw.tenant_queue_manifests(ns, gpu_quota=flavors)
    stop = threading.Event()
    if noop_check:
        _ensure_noop_check(api)
        manifests[1]["spec"]["admissionChecksStrategy"] = {
            "admissionChecks": [{"name": NOOP_CHECK}]}
        threading.Thread(target=noop_check_controller, args=(kc.api_client(), ns, NOOP_CHECK,
                                                             stop), daemon=True).start()
    kw.create_tenant_queue(api, manifests)
    seen: dict[str, float] = {}
    watcher = threading.Thread(
        target=watch_admissions, args=(kc.api_client(), ns, seen, jobs, stop), daemon=True
    )
    watcher.start()
    clients = [kc.api_client() for _ in range(workers)]

    def create(i: int) -> None:
        body = kw.gpu_job_manifest(f"j{i:05d}", ns, "gpu", gpus=1, duration_s=duration_s)
        k8s().BatchV1Api(clients[i % workers]).create_namespaced_job(ns, cast(Any, body))

    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(create, range(jobs)))
        t_submitted = time.monotonic()
        log(f"  submitted {jobs} jobs in {t_submitted - t0:.1f}s; waiting for admissions")
        last_report = 0
        deadline = time.monotonic() + max(WAIT_S, jobs * 2.0)
        while len(seen) < jobs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(seen)}/{jobs} admitted")
            if len(seen) - last_report >= 100:
                last_report = len(seen) // 100 * 100
                log(f"  {len(seen)}/{jobs} admitted after {time.monotonic() - t0:.1f}s")
            time.sleep(0.25)
        stop.set()
        if on_admitted is not None:
            on_admitted()
        times = sorted(seen.values())
        burst_n = min(jobs, gpus_total)
        result = {
            "jobs": float(jobs),
            "submit_s": t_submitted - t0,
            "all_admitted_s": times[-1] - t0,
            "rate": jobs / (times[-1] - t0),
            "burst_n": float(burst_n),
            "burst_rate": burst_n / max(times[burst_n - 1] - t0, 1e-3),
            "steady_rate": steady_rate(times),
        }
    finally:
        stop.set()
        log(f"  cleaning up {ns} (jobs, pods, workloads) ...")
        kw.delete_tenant_queue(api, ns, timeout_s=600)
        if noop_check:
            with contextlib.suppress(Exception):
                k8s().CustomObjectsApi(api).delete_cluster_custom_object(
                    kw.KUEUE_GROUP, kw.KUEUE_API_VERSION, "admissionchecks", NOOP_CHECK)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=500, help="K jobs for the baseline")
    parser.add_argument("--duration", type=int, default=1, help="seconds each job runs")
    parser.add_argument("--workers", type=int, default=4, help="concurrent submitters")
    parser.add_argument(
        "--skip-e2e", action="store_true", help="do not run tests/e2e/test_cluster.py first"
    )
    args = parser.parse_args()

    # The images first, timed on their own (0 when every stage is cached).
    image_build_s = 0.0
    if kc.CPU_NODE_ENABLED:
        t0 = time.monotonic()
        images = kc.build_images(log)
        built = images["kestrel"].get("built") or images["pause"].get("built")
        image_build_s = time.monotonic() - t0 if built else 0.0
        log(f"images: {images['kestrel']['ref']} ({images['kestrel']['bytes'] / 2**20:.0f} MiB "
            f"archive), {images['pause']['ref']}; image_build_s={image_build_s:.1f}")
    info = kc.ensure_cluster(log)
    api = kc.api_client()
    start_rss = kc.data_plane_rss_mib()
    log(f"data plane rss before any checks: {start_rss:.0f} MiB")

    server = k8s().VersionApi(api).get_code().git_version
    nodes = k8s().CoreV1Api(api).list_node(label_selector="kestrel.dev/pool=gpu").items
    gpus = sum(int(n.status.allocatable.get("nvidia.com/gpu", "0")) for n in nodes)
    # Versions as reported by the running processes, not just the pins.
    kueue_version = kc.running_kueue_version() or f"{info.kueue_version}(pinned)"
    kwok_versions = {n.status.node_info.kubelet_version for n in nodes}  # "kwok-0.8.0"
    kwok_version = ",".join(sorted("v" + v.removeprefix("kwok-") for v in kwok_versions))

    e2e_ok = True
    if not args.skip_e2e:
        log("e2e checks (tests/e2e/test_cluster.py):")
        e2e_ok = run_e2e_tests()

    log("quota checks:")
    admitted_ok, held_ok = quota_checks(api)
    log("CPU pool (real kubelet node):")
    cpu_nodes, cpu_ran = cpu_pool_check(api)

    # Idle = no jobs, after the checks have exercised every component once (the Go
    # heaps have grown to their working size), the more conservative figure.
    for p in kc.process_health():
        log(f"  idle rss {p.component:<26} {p.rss_mib:7.1f} MiB")
    idle_rss = kc.data_plane_rss_mib()
    log(f"idle data plane rss: {idle_rss:.0f} MiB")

    log(f"baseline: {args.jobs} jobs x 1 GPU x {args.duration}s into a {gpus}-GPU ClusterQueue")
    res = bench(api, args.jobs, args.duration, args.workers, gpus)
    log(
        f"  all {args.jobs} admitted {res['all_admitted_s']:.1f}s after the first submission "
        f"(submission took {res['submit_s']:.1f}s): {res['rate']:.1f} admissions/s; "
        f"first {int(res['burst_n'])} (the quota) at {res['burst_rate']:.1f}/s"
    )
    log(f"data plane rss after the baseline: {kc.data_plane_rss_mib():.0f} MiB")
    log(
        f"cluster: kubernetes={server} kueue={kueue_version} kwok={kwok_version} "
        f"gpu_nodes={len(nodes)} gpus={gpus} "
        f"admitted_within_quota={str(admitted_ok).lower()} held_over_quota={str(held_ok).lower()} "
        f"kueue_admit_per_s={res['rate']:.1f} idle_rss_mib={idle_rss:.0f} "
        f"cpu_nodes={cpu_nodes} cpu_pod_ran={str(cpu_ran).lower()} "
        f"image_build_s={image_build_s:.0f}"
    )
    cpu_ok = cpu_ran or not kc.CPU_NODE_ENABLED
    return 0 if admitted_ok and held_ok and e2e_ok and cpu_ok else 1


if __name__ == "__main__":
    sys.exit(main())
