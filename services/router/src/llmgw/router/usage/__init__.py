"""Usage after a request: the spool that keeps what the stream has not taken (`spool`), the
stream read back (`stream_reader`), summed into slots (`rollup`, pure; `book`) in a process of
its own (`summing`)."""
