"""Glued lines, continuation detection and identity inheritance along one stream."""

from __future__ import annotations

import pytest

from ingest.multiline import IdentityCarrier, is_continuation, split_glued
from ingest.prefixes import Identity

BAR = "Epoch 3:  41%|████▏     | 2050/5000 [1:02:03<1:29:30,  0.55it/s, loss=1.93, v_num=7]"


def test_tqdm_bar_with_record_glued_behind_is_split() -> None:
    glued = BAR + "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout"
    assert split_glued(glued) == [
        BAR,
        "[E ProcessGroupNCCL.cpp:475] [Rank 2] Watchdog caught collective operation timeout",
    ]


def test_tqdm_bar_with_unknown_eta_and_glued_text() -> None:
    bar = "  0%|          | 0/10 [00:00<?, ?it/s]"
    assert split_glued(bar + "RuntimeError: boom") == [bar, "RuntimeError: boom"]


def test_tqdm_without_total_and_glued_text() -> None:
    bar = "812it [00:42, 19.10it/s]"
    assert split_glued(bar + "[rank0]: Traceback (most recent call last):") == [
        bar,
        "[rank0]: Traceback (most recent call last):",
    ]


def test_carriage_return_redraws_collapse_to_the_last_bar_state() -> None:
    bar1 = " 10%|█         | 1/10 [00:01<00:09,  1.00it/s]"
    bar2 = " 20%|██        | 2/10 [00:02<00:08,  1.00it/s]"
    bar3 = " 30%|███       | 3/10 [00:03<00:07,  1.00it/s]"
    assert split_glued(f"{bar1}\r{bar2}\r{bar3}\r") == [bar3]


def test_carriage_return_redraw_followed_by_a_record() -> None:
    bar1 = " 10%|█         | 1/10 [00:01<00:09,  1.00it/s]"
    bar2 = " 20%|██        | 2/10 [00:02<00:08,  1.00it/s]"
    assert split_glued(f"{bar1}\r{bar2}\rTraceback (most recent call last):") == [
        bar2,
        "Traceback (most recent call last):",
    ]


def test_bar_at_end_of_line_is_left_alone() -> None:
    assert split_glued(BAR) == [BAR]


def test_interleaved_what_keeps_one_what_and_the_text() -> None:
    line = "  what():    what():  [PG 0 (default_pg) Rank 5] Process group watchdog thread terminated"
    assert split_glued(line) == [
        "  what():  [PG 0 (default_pg) Rank 5] Process group watchdog thread terminated"
    ]


@pytest.mark.parametrize(
    "line",
    [
        "plain line with nothing glued",
        "eap-server  | INFO: 127.0.0.1 - GET /health 200",
        "| a | markdown | table |",
        "",
    ],
)
def test_lines_without_glue_come_back_unchanged(line: str) -> None:
    assert split_glued(line) == [line]


@pytest.mark.parametrize(
    "line",
    [
        '  File "/srv/app/train.py", line 12, in <module>',
        "    loss.backward()",
        "             ^^^^^^^^^^^^",
        "^^^^^^^",
        "frame #7: <unknown function> + 0x1a2b (0x7f00 in /lib/libc.so.6)",
        "Exception raised from recvBytes at /pytorch/torch/csrc/distributed/c10d/Utils.hpp:670 (most recent call first):",
        "Last error:",
        " 5 0x00000000000511aa ncclGroupEnd()  ???:0",
        "12      0x7f1234567890 tensorrt_llm::runtime::NcclCommunicator::createComm(int) + 316",
        "==== backtrace (tid:   8812) ====",
        "================================================",
        "\tat some.java.Frame(Frame.java:10)",
        "The above exception was the direct cause of the following exception:",
        "During handling of the above exception, another exception occurred:",
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.",
        "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
        "ncclUnhandledCudaError: Call to CUDA function failed.",
    ],
)
def test_continuation_lines(line: str) -> None:
    assert is_continuation(line)


@pytest.mark.parametrize(
    "line",
    [
        "Traceback (most recent call last):",
        "RuntimeError: CUDA error: out of memory",
        "[rank0]: step 3",
        "Epoch 1: 100%",
        "NCCL WARN Cuda failure 'out of memory'",
        "terminate called after throwing an instance of 'std::runtime_error'",
        "",
    ],
)
def test_not_continuation_lines(line: str) -> None:
    assert not is_continuation(line)


def feed_all(lines: list[str]) -> list[Identity]:
    carrier = IdentityCarrier(year=2025)
    return [carrier.feed(line) for line in lines]


def test_traceback_frames_and_exception_line_inherit_the_prefixed_record() -> None:
    out = feed_all(
        [
            "gpu-node-3:5151:5200 [2] NCCL INFO comm 0xabc rank 2 nranks 4 - Init COMPLETE",
            "[rank2]: Traceback (most recent call last):",
            '  File "/srv/train.py", line 40, in <module>',
            "    main()",
            "    ^^^^^^",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "CUDA kernel errors might be asynchronously reported at some other API call.",
            "Epoch 2 starting",
            '  File "/not/a/continuation/of/rank2.py", line 1',
        ]
    )
    assert [i.rank for i in out] == [None, 2, 2, 2, 2, 2, 2, None, None]
    assert out[0].host == "gpu-node-3" and out[0].gpu == "2" and out[0].pid == 5151
    # the inherited lines keep their own text
    assert out[2].text == '  File "/srv/train.py", line 40, in <module>'
    assert out[5].text == "RuntimeError: CUDA error: an illegal memory access was encountered"


def test_nccl_host_pid_gpu_are_inherited_by_backtrace_lines() -> None:
    out = feed_all(
        [
            "[c0ffee123456:812 :0:830] Caught signal 7 (Bus error: nonexistent physical address)",
            "==== backtrace (tid:    830) ====",
            " 0 0x0000000000042520 __sigaction()  ???:0",
            " 1 0x00000000000a1b2c ncclProxyService()  ???:0",
            "=================================",
        ]
    )
    assert all(i.host == "c0ffee123456" and i.pid == 812 for i in out)


def test_last_error_detail_line_inherits() -> None:
    out = feed_all(
        [
            "[rank6]:[E305 01:02:03.000000001 ProcessGroupNCCL.cpp:1700] [Rank 6] NCCL error: remote process exited",
            "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.",
            "Last error:",
            "socketProgressOpt: Call to recv from 10.1.2.3<4455> failed : Connection reset by peer",
            "Exception raised from checkForNCCLErrorsInternal at ProcessGroupNCCL.cpp:2363 (most recent call first):",
            "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f in libc10.so)",
            "some unrelated line",
        ]
    )
    assert [i.rank for i in out] == [6, 6, 6, 6, 6, 6, None]


def test_chained_traceback_stays_with_its_rank_across_blank_lines() -> None:
    out = feed_all(
        [
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "/x.py", line 1, in f',
            "[rank0]: RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed.",
            "",
            "The above exception was the direct cause of the following exception:",
            "",
            "Traceback (most recent call last):",
            '  File "/y.py", line 2, in g',
            "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly",
        ]
    )
    assert [i.rank for i in out] == [0, 0, 0, None, 0, None, 0, 0, 0]


def test_unprefixed_traceback_after_a_different_record_does_not_inherit() -> None:
    out = feed_all(
        [
            "[rank1]: loss 2.0",
            "Traceback (most recent call last):",
            '  File "/z.py", line 3, in h',
            "ValueError: bad",
        ]
    )
    assert [i.rank for i in out] == [1, None, None, None]


def test_carrier_completes_year_from_earlier_dated_line() -> None:
    carrier = IdentityCarrier()
    carrier.feed("2021-07-01T00:00:00Z starting")
    ident = carrier.feed("[rank0]:[E702 10:00:00.000000001 x.cpp:1] late")
    assert ident.ts is not None and ident.ts.year == 2021


def test_carrier_reset_forgets_the_record() -> None:
    carrier = IdentityCarrier()
    carrier.feed("[rank4]: Traceback (most recent call last):")
    carrier.reset()
    assert carrier.feed('  File "/a.py", line 1, in b').rank is None
