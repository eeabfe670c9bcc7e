"""Which connections the front sheds for a newcomer (`seats.Seats`, pure): past a limit per client
address its own, past the limit in all anyone's; never answered before answered, longest resting
first; one being answered never. The same on real sockets: test_front.py (the 503) and the floods
in tests/test_faults_router.py."""

from llmgw.router.http.seats import Seats


class Conn:
    """A connection as the seats see it: its address, whether it was answered, closed or not."""

    def __init__(self, seats: Seats, address: str = "a", answered: bool = False) -> None:
        self.seats, self.address, self.answered, self.closed = seats, address, answered, False

    def close(self) -> None:
        self.closed = True
        self.seats.leave(self)


def seat(seats: Seats, address: str = "a", answered: bool = False) -> Conn | None:
    conn = Conn(seats, address, answered)
    return conn if seats.admit(conn) else None


def test_an_address_past_its_limit_sheds_its_own_longest_resting_and_no_other():
    seats = Seats(most=100, most_per_client=3)
    first, second, third = (seat(seats) for _ in range(3))
    beside = seat(seats, "b")
    fourth = seat(seats)
    assert first.closed and not any(c.closed for c in (second, third, beside, fourth))
    assert seats.per_client == {"a": 3, "b": 1} and seats.shed == 1


def test_past_the_limit_in_all_the_never_answered_go_before_the_answered_and_the_busy_never():
    seats = Seats(most=3, most_per_client=3)
    busy, kept, fresh = seat(seats, "a"), seat(seats, "b", answered=True), seat(seats, "c")
    seats.busy(busy)
    newcomer = seat(seats, "d")
    assert fresh.closed and not kept.closed and not busy.closed  # the fresh one, though it came last
    seats.busy(newcomer)
    seat(seats, "e")
    assert kept.closed and not busy.closed and not newcomer.closed
    assert len(seats.held) == 3


def test_one_coming_back_to_rest_is_the_last_of_its_kind_to_go():
    seats = Seats(most=2, most_per_client=2)
    older, newer = seat(seats, "a", answered=True), seat(seats, "b", answered=True)
    seats.busy(older)
    seats.rest(older)  # answered again just now
    seat(seats, "c")
    assert newer.closed and not older.closed


def test_with_every_seat_busy_a_newcomer_is_refused_and_a_seat_left_is_taken_again():
    seats = Seats(most=2, most_per_client=2)
    held = [seat(seats, x) for x in "ab"]
    for conn in held:
        seats.busy(conn)
    assert seat(seats, "c") is None and len(seats.held) == 2
    held[0].close()
    held[0].close()  # twice: counted once
    assert seat(seats, "c") is not None and seats.per_client == {"b": 1, "c": 1}
