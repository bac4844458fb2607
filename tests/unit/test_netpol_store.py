"""The enforcer's object store: newest version wins, deletions are not undone."""

from __future__ import annotations

from typing import Any

from sandpod_netpol.kube import ObjectStore


def obj(name: str, version: int, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "ns",
            "name": name,
            "resourceVersion": str(version),
            "labels": labels,
        }
    }


def test_newer_versions_replace_older_ones() -> None:
    store = ObjectStore()
    assert store.upsert(obj("a", 5, v="1"))
    assert store.upsert(obj("a", 7, v="2"))
    assert store.get(("ns", "a")) == obj("a", 7, v="2")


def test_a_slow_read_cannot_roll_an_object_back() -> None:
    store = ObjectStore()
    store.upsert(obj("a", 7, v="new"))
    assert not store.upsert(obj("a", 6, v="old"))
    assert store.get(("ns", "a")) == obj("a", 7, v="new")


def test_a_slow_read_cannot_resurrect_a_deleted_object() -> None:
    store = ObjectStore()
    store.upsert(obj("a", 7))
    assert store.delete(obj("a", 9))
    assert not store.upsert(obj("a", 8))
    assert store.get(("ns", "a")) is None
    assert store.upsert(obj("a", 10))  # re-created later


def test_replace_takes_a_fresh_list() -> None:
    store = ObjectStore()
    store.upsert(obj("a", 1))
    store.replace([obj("b", 2)])
    assert store.keys() == {("ns", "b")}
