"""StraitMQ benchmark harness and Java tooling (Apache Kafka reference broker, Java client harness).

Modules:
  bench.javatools   classpath(), run_java(), straitclient(): the Kafka 3.9 / 4.4 jars, StraitClient
  bench.kafka_ref   KafkaRef(port): a real Apache Kafka 4.4 broker (KRaft, combined mode)
  bench.throughput  python -m bench.throughput ...: StraitMQ vs Kafka throughput/latency
"""
