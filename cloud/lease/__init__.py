"""The lease protocol: host streams, push dispatch, coalesced renewals, expiry sweeps."""
