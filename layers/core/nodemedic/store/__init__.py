"""Persistence: the DynamoDB incident ledger."""
