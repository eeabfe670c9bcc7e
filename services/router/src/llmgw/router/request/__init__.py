"""A request's way through the router, top down: prepared and checked (`prepare`, the rules in
`core`), admitted and forwarded (`gateway`), tried on replicas (`proxy`), relayed back (`relay`,
the SSE rules in `sse`), and its outcome told once (`outcome`)."""
