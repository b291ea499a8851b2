"""The labelling sample file of a run with large contexts: `python -m bench.sample_file`.

30 items of 10 claims and one 900 KB passage each are scored by the offline judge, all 30 are
drawn as the sample, and 3 clients read `GET /v1/runs/{id}/labels/sample?format=csv` (each row
repeats its item's passages: 270 MB per file) at once. The table gives the API's RSS before
and its peak meanwhile. Prints a table; asserts nothing.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import psutil

from bench import harness

ITEMS, CLAIMS, PASSAGE_BYTES, READERS = 30, 10, 900_000, 3


def _read(url: str, run_id: str, sizes: list[int]) -> None:
    with (
        httpx.Client(timeout=600) as client,
        client.stream("GET", f"{url}/v1/runs/{run_id}/labels/sample?format=csv") as response,
    ):
        response.raise_for_status()
        sizes.append(sum(len(chunk) for chunk in response.iter_bytes()))


def main() -> None:
    with harness.environment(0) as env:
        api, url = harness.start_api(env["env"])
        worker = harness.start_worker(env["env"], 2)
        try:
            truth = " ".join(f"Sentence number {k} is here." for k in range(CLAIMS))
            passage = "word " * (PASSAGE_BYTES // 5)
            items = [
                {"id": f"m{i}", "ground_truth": truth, "context": [passage]} for i in range(ITEMS)
            ]
            body = "".join(json.dumps(item) + "\n" for item in items).encode()
            submitted = httpx.post(
                f"{url}/v1/runs",
                content=body,
                headers={"content-type": "application/x-ndjson"},
                params={"model": "local/lexical"},
                timeout=600,
            )
            submitted.raise_for_status()
            run_id = str(submitted.json()["id"])
            harness.wait(url, run_id)
            drawn = httpx.post(f"{url}/v1/runs/{run_id}/labels/sample", json={"size": ITEMS})
            drawn.raise_for_status()
            process = psutil.Process(api.proc.pid)
            before = peak = process.memory_info().rss
            sizes: list[int] = []
            readers = [
                threading.Thread(target=_read, args=(url, run_id, sizes)) for _ in range(READERS)
            ]
            started = time.perf_counter()
            for reader in readers:
                reader.start()
            while any(reader.is_alive() for reader in readers):
                peak = max(peak, process.memory_info().rss)
                time.sleep(0.05)
            elapsed = time.perf_counter() - started
        finally:
            worker.stop()
            api.stop()
    print(f"{'readers':>8} {'file':>9} {'API RSS before':>15} {'peak':>8} {'grown':>8} {'time':>7}")
    print(
        f"{READERS:>8} {sizes[0] / 2**20:>7.0f}MB {before / 2**20:>13.0f}MB "
        f"{peak / 2**20:>6.0f}MB {(peak - before) / 2**20:>6.0f}MB {elapsed:>6.1f}s"
    )


if __name__ == "__main__":
    main()
