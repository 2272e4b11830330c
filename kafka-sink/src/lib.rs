//! `exactly-kafka-sink`: an exactly-once Kafka sink built on Kafka transactions, with a reused pool
//! of transactional ids and commit-after-restart through the Kafka protocol.
