"""What crosses the wire: the lead <-> back protocol, lead's HTTP as its clients read it
(replies, streams, /metrics), and llama.cpp's RPC endpoints."""
