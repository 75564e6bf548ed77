"""The Ray backend: admitted jobs run on a Ray cluster's nodes, each node's guard asked first."""
