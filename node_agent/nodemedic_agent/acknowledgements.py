"""Whether the pipeline has decided on an event this agent sent.

Detect records its decision on every event it decides on (remediate, deduplicated, monitor,
rejected) in the stack's ledger, under the event's id: ``EVENT#nodemedic.agent/<event id>``.
The agent reads that item before it sends an event again, and stops once it is there. The
stack's ``AgentPublishPolicy`` allows ``dynamodb:GetItem`` on items with that prefix only.
"""

from __future__ import annotations

import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from nodemedic.contracts.events import AGENT_SOURCE, acknowledgement_key

log = logging.getLogger("nodemedic_agent")


class Acknowledgements:
    def __init__(self, client: Any, table: str) -> None:
        self.client = client
        self._table = table
        self.errors = 0
        self.last_error = ""

    def decision(self, event_id: str) -> str | None:
        """Detect's decision on the event; None when there is none yet or it could not be read
        (the event is then sent again: a second send of a decided event changes nothing)."""
        try:
            item = self.client.get_item(TableName=self._table,
                                     Key={"pk": {"S": acknowledgement_key(AGENT_SOURCE, event_id)}},
                                     ProjectionExpression="#d", ExpressionAttributeNames={"#d": "decision"})
        except (BotoCoreError, ClientError) as exc:
            self.errors += 1
            if str(exc) != self.last_error:
                log.warning("cannot read whether the pipeline decided on event %s (%s); sending it again",
                            event_id, exc)
            self.last_error = str(exc)
            return None
        found = item.get("Item")
        return str(found["decision"]["S"]) if found and "decision" in found else None
