"""The scheduler's pure core: no I/O, no clock (time is passed in).

- `reconcile(desired, actual, now, policy) -> Plan`: what to start and stop, model by model;
  `improve`: its local improvement of a try's starts (moves and trades).
- `observe(heartbeat, recorded, draining, now) -> Plan`: what a heartbeat means for the records.
- `merge(spec, report) -> ReplicaState`: the record the replicas bucket holds; `accept` says
  which reports change it.
- `listen` / `heard`: the time the scheduler could not judge nodes by (away from NATS, or
  hearing no node): a node is lost only for its silence outside it (`Hearing`, `silence`);
  `health`: how a node stands by that rule (ready, suspect, lost), as reconcile judges it.
- `status` / `model_statuses`: how each model is doing; `wanted`, `backoff_s`.
- `room_left`: how many more replicas of a model's profiles fit now, and with preemption.
"""

from llmgw.scheduler.core._exact import highs
from llmgw.scheduler.core._hearing import Hearing, health, heard, listen, silence
from llmgw.scheduler.core._improve import improve
from llmgw.scheduler.core._observe import lost, lost_workers, observe
from llmgw.scheduler.core._plan import Actual, AgentStop, Desired, NodeView, Plan, Policy, Start, Stop
from llmgw.scheduler.core._reconcile import reconcile
from llmgw.scheduler.core._replica import accept, merge, spec_of
from llmgw.scheduler.core._room_left import MOST_COUNTED, room_left
from llmgw.scheduler.core._status import CLASS_RANK, backoff_s, model_statuses, status, wanted

__all__ = [
    "CLASS_RANK",
    "MOST_COUNTED",
    "Actual",
    "AgentStop",
    "Desired",
    "Hearing",
    "NodeView",
    "Plan",
    "Policy",
    "Start",
    "Stop",
    "accept",
    "backoff_s",
    "health",
    "heard",
    "highs",
    "improve",
    "listen",
    "lost",
    "lost_workers",
    "merge",
    "model_statuses",
    "observe",
    "reconcile",
    "room_left",
    "silence",
    "spec_of",
    "status",
    "wanted",
]
