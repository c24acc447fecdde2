"""Steps that post-process the new global model of any averaging strategy (docs/design.md, "Messages, strategies
and engines").

``strategy.wrap = ["fedlws"]`` shrinks each layer of the aggregate (FedLWS, paper 002); ``["fedtlu"]`` keeps the
aggregate only on the highest-scoring blocks and the previous global model elsewhere (FedTLU, paper 003).
A wrapper implements the same ``Strategy`` protocol by delegating to the strategy it wraps, so the clients
receive exactly the instructions of the inner strategy: neither step asks a hospital for anything more.
The maths is in each wrapper's module, beside it (``fedlws.lws_factors``, ``fedtlu.tlu_scores``).
"""
