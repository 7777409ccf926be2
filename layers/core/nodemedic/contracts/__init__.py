"""Message contracts shared by the node agent, the stage Lambdas and the operator tools."""
