"""The tuner's resumable cache: one JSON object per line, stamped with what makes results valid.

The first line is the stamp (GPU, flashtune version, torch, kernel-source hash). A cache
whose stamp differs is set aside (renamed *.stale) rather than trusted. A truncated last
line, left by an interrupted run, is ignored; everything before it is reused.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


class TuneCache:
    def __init__(self, path: str | os.PathLike, stamp: dict):
        self.path = Path(path)
        self.stamp = stamp
        self.records: dict[str, dict] = {}
        self.set_aside: Path | None = None
        self._load()

    @staticmethod
    def key(*parts) -> str:
        return "|".join(map(str, parts))

    def _load(self) -> None:
        lines = self.path.read_text().splitlines() if self.path.is_file() else []
        parsed = []
        for line in lines:
            try:
                parsed.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut short by an interrupted run: stop trusting the file there
        if parsed and parsed[0].get("stamp") == self.stamp:
            self.records = {r["key"]: r for r in parsed[1:] if "key" in r}
            self._rewrite() if len(parsed) != len(lines) else None
            return
        if parsed:  # another GPU, version or kernel: keep it, but do not reuse it
            self.set_aside = self.path.with_suffix(self.path.suffix + ".stale")
            os.replace(self.path, self.set_aside)
        self._rewrite()

    def _rewrite(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps({"stamp": self.stamp}) + "\n")
            for record in self.records.values():
                f.write(json.dumps(record) + "\n")
        os.replace(tmp, self.path)

    def get(self, key: str) -> dict | None:
        return self.records.get(key)

    def put(self, key: str, **record) -> dict:
        record = {"key": key, **record}
        self.records[key] = record
        with open(self.path, "a") as f:  # one flushed line per result: an interruption loses one at most
            f.write(json.dumps(record) + "\n")
        return record
