"""Helpers of the egress proxy (Squid): the grant check and the refusal monitor."""
