"""RadixAttention's prefix tree: token sequences → KV slots, page-aligned, with reference-counted locks and
LRU eviction of unreferenced leaves."""
from __future__ import annotations

import heapq
import itertools
import time
from collections import defaultdict
from collections.abc import Callable

import torch

from toolkit.runtime.memory.prefix_cache import InsertResult, MatchResult, PrefixCache

_ids = itertools.count()


class TreeNode:
    __slots__ = ("children", "parent", "key", "value", "lock_ref", "last_access_time", "id", "prefix_len")

    def __init__(self, parent: TreeNode | None = None, key: list[int] | None = None,
                 value: torch.Tensor | None = None) -> None:
        self.children: dict[object, TreeNode] = {}
        self.parent = parent
        self.key: list[int] = key or []
        self.value = value
        self.lock_ref = 0
        self.last_access_time = time.monotonic()
        self.id = next(_ids)
        # NOTE: tokens from the root through this node; a split keeps it for the lower half.
        self.prefix_len = (parent.prefix_len if parent is not None else 0) + len(self.key)

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixCache(PrefixCache):
    def __init__(self, free_slots: Callable[[torch.Tensor], None], page_size: int = 1,
                 device: torch.device | str = "cpu") -> None:
        self.free_slots = free_slots
        self.page_size = page_size
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.root = TreeNode(key=[], value=torch.empty(0, dtype=torch.int64, device=self.device))
        self.root.lock_ref = 1
        self._evictable = 0
        self._protected = 0

    # ---- keys ----
    def _child_key(self, key: list[int]) -> object:
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def _match_len(self, stored: list[int], key: list[int]) -> int:
        limit = min(len(stored), len(key))
        n = 0
        if self.page_size == 1:
            while n < limit and stored[n] == key[n]:
                n += 1
            return n
        while n + self.page_size <= limit and stored[n : n + self.page_size] == key[n : n + self.page_size]:
            n += self.page_size
        return n

    def _aligned(self, key: list[int]) -> list[int]:
        return key[: len(key) // self.page_size * self.page_size]

    # ---- the six verbs ----
    def match_prefix(self, key: list[int]) -> MatchResult:
        key = self._aligned(key)
        node, values = self.root, []
        now = time.monotonic()
        while key and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            child.last_access_time = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                node = self._split(child, n)
                values.append(node.value)
                break
            values.append(child.value)
            node, key = child, key[n:]
        indices = torch.cat(values) if values else self.root.value
        return MatchResult(indices, node)

    def insert(self, key: list[int], value: torch.Tensor) -> InsertResult:
        key, value = self._aligned(key), value[: len(self._aligned(key))]
        node, matched, values = self.root, 0, []
        now = time.monotonic()
        while key and self._child_key(key) in node.children:
            child = node.children[self._child_key(key)]
            child.last_access_time = now
            n = self._match_len(child.key, key)
            matched += n
            key, value = key[n:], value[n:]
            node = self._split(child, n) if n < len(child.key) else child
            values.append(node.value)
        if key:
            node = self._add_leaf(node, key, value)
            values.append(node.value)
        indices = torch.cat(values) if values else self.root.value
        return InsertResult(matched, indices, node)

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> TreeNode:
        leaf = TreeNode(parent=parent, key=list(key), value=value.clone())
        parent.children[self._child_key(key)] = leaf
        self._evictable += len(key)
        return leaf

    def cached_len(self, node: TreeNode | None) -> int:
        return 0 if node is None else node.prefix_len

    def inc_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        while node is not self.root:
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        heap = [(leaf.last_access_time, leaf.id, leaf) for leaf in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            self.free_slots(leaf.value)
            freed += len(leaf.key)
            self._delete_leaf(leaf)
            parent = leaf.parent
            if parent is not self.root and parent.is_leaf and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
        return freed

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def total_size(self) -> int:
        return sum(len(node.key) for node in self._nodes())

    def check_integrity(self) -> None:
        evictable = sum(len(n.key) for n in self._nodes() if n.lock_ref == 0)
        protected = sum(len(n.key) for n in self._nodes() if n.lock_ref > 0)
        assert evictable == self._evictable, f"evictable_size {self._evictable} != tree's {evictable}"
        assert protected == self._protected, f"protected_size {self._protected} != tree's {protected}"
        for node in self._nodes():
            assert len(node.key) == len(node.value), f"node {node.id}: {len(node.key)} keys, {len(node.value)} slots"
            assert len(node.key) % self.page_size == 0, f"node {node.id} is not page-aligned"
            assert node.lock_ref >= 0, f"node {node.id} has a negative lock count"
            assert node.prefix_len == node.parent.prefix_len + len(node.key), f"node {node.id}: wrong prefix_len"
            if node.parent is not self.root:
                assert node.lock_ref <= node.parent.lock_ref, f"node {node.id} is locked more than its parent"

    def dfs_weight_order(self, handles: list[TreeNode | None]) -> list[int]:
        """Positions of `handles` (match lock handles) depth-first over the tree, heavier subtrees (more handles
        under them) first; handles at the same node keep their order."""
        at: dict[int, list[int]] = defaultdict(list)
        nodes: dict[int, TreeNode] = {}
        for i, node in enumerate(handles):
            node = node or self.root
            at[node.id].append(i)
            nodes[node.id] = node
        weight: dict[int, int] = defaultdict(int)
        for node_id, positions in at.items():
            node = nodes[node_id]
            while node is not None:
                weight[node.id] += len(positions)
                node = node.parent
        order: list[int] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            order.extend(at.get(node.id, []))
            children = sorted(node.children.values(), key=lambda c: weight[c.id])
            stack.extend(c for c in children if weight[c.id] > 0)
        return order

    # ---- internals ----
    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Cut `child` after n tokens; returns the new node holding the first n."""
        head = TreeNode(parent=child.parent, key=child.key[:n], value=child.value[:n])
        head.lock_ref = child.lock_ref
        head.last_access_time = child.last_access_time
        child.parent.children[self._child_key(head.key)] = head
        child.key, child.value, child.parent = child.key[n:], child.value[n:], head
        head.children[self._child_key(child.key)] = child
        return head

    def _delete_leaf(self, leaf: TreeNode) -> None:
        del leaf.parent.children[self._child_key(leaf.key)]
        self._evictable -= len(leaf.key)

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _evictable_leaves(self) -> list[TreeNode]:
        return [n for n in self._nodes() if n.is_leaf and n.lock_ref == 0]


class NoPrefixCache(PrefixCache):
    """--disable-radix-cache: an empty tree that keeps nothing it is given, so nothing is shared or kept after a
    request finishes."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._empty = torch.empty(0, dtype=torch.int64, device=device)

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(self._empty, None)

    def insert(self, key: list[int], value: torch.Tensor) -> InsertResult:
        return InsertResult(0, self._empty, None)

    def cached_len(self, node: None) -> int:
        return 0

    def inc_lock_ref(self, node) -> None:
        pass

    def dec_lock_ref(self, node) -> None:
        pass

    def evict(self, num_tokens: int) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def reset(self) -> None:
        pass

    def check_integrity(self) -> None:
        pass
