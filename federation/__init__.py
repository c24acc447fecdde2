"""Everything federated: manifest loading, client recipes, aggregation maths, strategies and engines."""
