"""Domain errors.

The class name is what a Lambda reports as ``errorType``, so the state machine's
``Retry``/``Catch`` clauses match on these names. Only subclasses of
:class:`RetryableError` are listed in a ``Retry`` clause.
"""


class NodeMedicError(Exception):
    """Base class of every error the pipeline raises on purpose."""


class RetryableError(NodeMedicError):
    """A condition expected to clear by itself; the state machine retries it."""


class InvalidEventError(NodeMedicError):
    """The input is not a valid health event, alarm or runbook request."""


class UnknownNodeError(NodeMedicError):
    """The event names a node that is not a member of the cluster."""


class UnknownNodeQuietError(NodeMedicError):
    """An unknown node, within a window where one page about unknown nodes was sent already:
    counted (metric EventsRejected), not paged again."""


class IncidentStateError(NodeMedicError):
    """The ledger does not hold the incident a stage was asked to work on."""


class CommandFailedError(NodeMedicError):
    """A command run on an instance through SSM ended in failure."""


class CommandPendingError(RetryableError):
    """A command run through SSM did not finish before the stage's deadline."""


class InstanceNotManagedError(RetryableError):
    """SSM refused to send to the instance (``InvalidInstanceId``): its agent has not registered it
    yet, as on an instance still booting, or it is shutting down or terminated."""


class InstanceGoneError(NodeMedicError):
    """The instance is gone, ended by someone else (an Auto Scaling health check, an operator, EC2,
    HyperPod's own recovery): SSM refused to send to it and EC2 says it is shutting down or
    terminated, or HyperPod has no such node any more. Nothing will ever reach it. Not retried."""


class NodeGoneError(NodeMedicError):
    """The orchestrator no longer has the node: on Kubernetes the API server answers 404, the cloud
    node-lifecycle controller having deleted the node of an instance that ended. No work can land
    on it; nothing is left there to cordon or uncordon."""


class HealthCheckPendingError(RetryableError):
    """The provider's own health check of the node has not decided yet (SageMaker HyperPod: the
    node is still booting, being updated, or running HyperPod's deep health check)."""


class DrainFailedError(NodeMedicError):
    """The scheduler refused to drain the node."""


class ReplacementPendingError(RetryableError):
    """No replacement instance is in service yet."""


class ReplacementFailedError(NodeMedicError):
    """The provider cannot replace or reboot the instance."""


class PolicyError(NodeMedicError):
    """The cluster's safety policy is missing or invalid; automation holds until it is fixed."""


class ThrottledError(RetryableError):
    """The cluster already runs its maximum of concurrent remediations."""


class ControlConflictError(RetryableError):
    """Another gate changed the cluster's control state at the same moment; decide again."""


class ResumeFailedError(NodeMedicError):
    """The node could not be returned to service."""


class ReturnLostError(RetryableError):
    """The node was returned (its drain lifted, the scheduler said so) but reads drained again by
    the same incident: the scheduler lost the change (slurmctld restarted from state it saved
    before). The Resume stage returned it again; the state machine calls it once more to see it
    stay back."""


class CapacityError(NodeMedicError):
    """AWS has no capacity for the replacement now (InsufficientInstanceCapacity and the like).
    The state machine retries the rung later, then escalates; the node stays drained."""


class CapacityEndsError(NodeMedicError):
    """The node's capacity ends (a Capacity Block's end, noted while its incident was open): no
    further rung; the state machine retires the node (it stays drained)."""


class EvictionPendingError(RetryableError):
    """Pods are still leaving the drained node (a PodDisruptionBudget blocks their eviction, or
    their namespace lets them run to completion) within the drain policy's timeout."""


class CheckpointPendingError(RetryableError):
    """The drain asked the node's jobs to checkpoint and waits for their markers, within the
    checkpoint policy's grace; the state machine calls the Drain stage again."""


class JobsPendingError(RetryableError):
    """Requeued jobs are not RUNNING yet."""


class NodeBusyError(RetryableError):
    """Right before a destructive step (GPU reset, reboot, replace) the node runs a job, or is no
    longer drained: nothing is done to it. Retried briefly (a requeued job leaving COMPLETING),
    then the incident ends escalated with the node as it is."""


class HandsOffError(NodeMedicError):
    """Right before a step that changes the node, automation is paused or the node is excluded
    (an operator's act while the incident was under way): nothing is done to it, and the incident
    ends escalated with the node as it is. Not retried: the operator's answer is the next step."""


class GpuClientsPendingError(RetryableError):
    """The pods that hold a Kubernetes node's GPUs open (the GPU operator's components, NVML
    clients) are still leaving it after their deploy labels were paused; the GPU reset waits."""


class NodeDrainingError(RetryableError):
    """A DEGRADED node (slow, not dead) still runs the job it was drained after: its check waits
    until the job ends, retried by the state machine for days, never killing the job."""


class ProviderBusyError(RetryableError):
    """The node's provider refused a reboot or replacement because it is working on the node
    itself (HyperPod: ``InstanceIdInUse``, another operation in progress, or
    ``InvalidInstanceStatus``, a status that allows none: its own repair, a patch, a deep health
    check; an Auto Scaling group: ``ScalingActivityInProgress``, ``ResourceContention``, another
    activity under way). Nothing was done; the state machine retries the rung for an hour, until
    that work ends, then escalates the incident with the node left drained."""


class PublishFailedError(RetryableError):
    """EventBridge did not take some entries of a PutEvents call; the caller's invocation is retried."""


class AwsThrottledError(RetryableError):
    """An AWS call was still throttled (or the service still unavailable) after the SDK's own
    retries, or an EKS cluster's API server was still busy or unreachable after the client's
    (``orchestrators.eks_auth``); the state machine retries the stage later, within its budget,
    then fails it."""
