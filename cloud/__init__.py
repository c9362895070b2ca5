"""The control plane: task store, lease protocol and the gRPC services operators and hosts call."""
