"""`rootrank ship`, one module per part; `runner` (ShipOptions, run_ship) is the way in.

runner       the two processes: the parent reads, a forked lower-priority one batches and sends
readers      pipes passed through and files tailed (rotation, truncation), into the chunk queue
chunks       Source, Chunk, and the ChunkQueue between readers and batcher (pipes spill to disk)
frames       the pipe from the parent to the shipping process
batcher      chunks -> lines -> ship-format messages
sender       messages to Kafka (acks=all), or to the spool while it cannot take them
positions    where followed files resume, saved only over durable messages; the files' backlog
spool        the bounded disk queue (the sender's spool, the chunk queue's overflow)
wire_format  rootrank's batch JSON, also read by the worker's decoder
progress     the backlog display
options      ShipOptions and the ShipStats counters
"""
