"""Trace-replay fleet simulator: continuous-batching replicas, the same sizing model and the
same autoscaling policy as the operator, against today's autoscalers."""
