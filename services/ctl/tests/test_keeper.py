"""When `llmgw up` starts a dead process again, and how it says so: a backoff with time passed in."""

import signal

from llmgw.ctl.keeper import Backoff, Keeper, how_it_ended


def test_a_first_death_is_restarted_after_the_first_delay():
    keeper = Keeper(Backoff(first_s=0.5, most_s=10, steady_s=30), now=100.0)
    assert keeper.ended(101.0) == 0.5
    assert not keeper.due(101.4) and keeper.due(101.5)


def test_deaths_in_a_row_double_the_delay_up_to_the_most():
    keeper = Keeper(Backoff(first_s=0.5, most_s=10, steady_s=30), now=0.0)
    delays = []
    now = 0.0
    for _ in range(8):
        now += 1.0  # died one second after each start: never steady
        delays.append(keeper.ended(now))
        now += delays[-1]
        keeper.started(now)
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10, 10, 10]


def test_a_process_that_ran_a_while_starts_from_the_first_delay_again():
    keeper = Keeper(Backoff(first_s=0.5, most_s=10, steady_s=30), now=0.0)
    for now in (1.0, 3.0, 6.0):
        keeper.ended(now)
        keeper.started(now + 0.1)
    assert keeper.ended(50.0) == 0.5


def test_a_running_process_is_never_due():
    keeper = Keeper(Backoff(), now=0.0)
    assert not keeper.due(1e9)
    keeper.ended(5.0)
    keeper.started(6.0)
    assert not keeper.due(1e9)


def test_how_a_process_ended_names_its_signal_or_its_exit_code():
    assert how_it_ended(-signal.SIGKILL) == "was killed by SIGKILL"
    assert how_it_ended(3) == "exited with code 3"
    assert how_it_ended(0) == "exited with code 0"
    assert how_it_ended(-200) == "was killed by signal 200"


def test_nats_is_started_again_for_its_store_only_once_it_said_so_and_the_disk_has_room():
    from llmgw.ctl.keeper import StoreWatch

    watch = StoreWatch(room_mb=64)
    watch.read(["[INF] Server is ready", "[ERR] JetStream failed to store a msg"])
    assert not watch.due(free_mb=10_000)  # a failure to store alone is not the store stopped
    watch.read(["[ERR] Filestore [usage] Critical write error: write ...: no space left on device"])
    assert not watch.due(free_mb=10)  # no room yet: starting it again would fail the same way
    assert watch.due(free_mb=64)
    watch.restarted()
    assert not watch.due(free_mb=10_000)
    assert not watch.due(free_mb=0.5)  # seen full: the log may not have taken the line
    assert watch.due(free_mb=100)
