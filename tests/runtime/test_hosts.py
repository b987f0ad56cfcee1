"""Messages about missing ranks say which node they are on (pycollective.runtime.hosts)."""

import numpy as np

from pycollective.runtime.hosts import NAME_BYTES, Hosts, missing, waiting_text

TWO = Hosts(["a", "a", "b", "b"])


def test_nodes_are_numbered_by_their_lowest_rank():
    hosts = Hosts(["y", "x", "y", "z", "x"])
    assert hosts.node_of == [0, 1, 0, 2, 1]
    assert hosts.members == [[0, 2], [1, 4], [3]]
    assert hosts.node(4) == "node 1 (host 'x')"


def test_names_come_from_nul_padded_rows():
    rows = np.zeros((2, NAME_BYTES), np.uint8)
    rows[0, :5] = np.frombuffer(b"node0", np.uint8)
    rows[1, :3] = np.frombuffer(b"h\xc3\xa9", np.uint8)
    assert Hosts.from_bytes(rows).names == ["node0", "h\u00e9"]


def test_a_whole_silent_node_is_named_as_a_node_that_stopped_answering():
    text = missing(TWO, 1, [2, 3])
    assert text.startswith("ranks [2, 3], every rank of node 1 (host 'b'), did not arrive: "
                           "that node stopped answering")
    assert text.endswith("this rank is on node 0 (host 'a')")


def test_part_of_a_node_and_ranks_of_this_node_are_named_apart():
    text = missing(Hosts(["a", "a", "b", "b", "b"]), 0, [1, 3])
    assert "ranks [1] on this rank's node 0 (host 'a') did not arrive (stopped" in text
    assert "ranks [3] on node 1 (host 'b') did not arrive (stopped" in text
    assert "stopped answering" not in text


def test_one_node_or_unknown_hosts_keep_the_plain_message():
    plain = "ranks [2] did not arrive (stopped, dead, or not calling it)"
    assert missing(None, 0, [2]) == plain
    assert missing(Hosts(["a"] * 3), 0, [2]) == plain


def test_a_node_wait_says_that_the_node_waits_for_another():
    assert waiting_text(TWO, 1, [2, 3], "the other ranks of this node") == (
        "the other ranks of this node (which wait in turn for ranks on other nodes)")
    assert waiting_text(TWO, 1, [0, 2], "the other ranks of this node") == (
        "the other ranks of this node")
    assert waiting_text(TWO, 1, [2, 3], "messages from rank 2") == "messages from rank 2"
