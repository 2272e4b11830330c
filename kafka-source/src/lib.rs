//! `exactly-kafka-source`: a Kafka source whose partition offsets live in checkpoints; offsets are
//! committed to the consumer group only after a checkpoint completes.
