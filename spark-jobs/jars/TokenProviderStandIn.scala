/*
 * StraitMQ: a stand-in for the four members of spark-token-provider-kafka-0-10 that
 * spark-sql-kafka-0-10 calls (found with `javap -c` on the spark-sql-kafka jar):
 *
 *   new KafkaConfigUpdater(module, params).set/setIfUnset/setAuthenticationConfigIfNeeded/build
 *   KafkaTokenUtil.findMatchingTokenClusterConfig / needTokenUpdate
 *   KafkaRedactionUtil.redactParams
 *
 * That artifact only implements Kafka *delegation tokens* (obtained by Spark on YARN/K8s with
 * Kerberos). This stand-in has none: every cluster is "not token-managed", so connections use
 * exactly the kafka.* options the job sets (PLAINTEXT, SSL or SASL with a JAAS config), which
 * is all StraitMQ needs. Compiled with the Scala compiler that pyspark ships, by
 * spark-jobs/jars/fetch.sh, into .cache/jars/spark-kafka/straitmq-token-provider-standin.jar.
 */
package org.apache.spark.kafka010

import java.{util => ju}

import scala.jdk.CollectionConverters._

import org.apache.spark.SparkConf

/** The cluster configuration a delegation token would belong to; never instantiated here. */
final class KafkaTokenClusterConf private ()

object KafkaTokenUtil {
  /** No delegation tokens are managed, so no cluster ever matches. */
  def findMatchingTokenClusterConfig(
      sparkConf: SparkConf,
      bootStrapServers: String): Option[KafkaTokenClusterConf] = None

  /** Without tokens a cached consumer or producer never needs re-creating for a new token. */
  def needTokenUpdate(
      params: ju.Map[String, Object],
      clusterConfig: Option[KafkaTokenClusterConf]): Boolean = false
}

object KafkaRedactionUtil {
  private val secretKeys = Set(
    "sasl.jaas.config", "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password")

  /** Parameters as printable pairs, with passwords and JAAS configs hidden (for debug logs). */
  def redactParams(params: Seq[(String, Object)]): Seq[(String, String)] =
    params.map { case (key, value) =>
      if (key != null && secretKeys.contains(key.toLowerCase)) (key, "*********(redacted)")
      else (key, String.valueOf(value))
    }
}

/** Builds the java.util.Map handed to KafkaConsumer/KafkaProducer/Admin. */
case class KafkaConfigUpdater(module: String, kafkaParams: Map[String, Object]) {
  private val params = new ju.HashMap[String, Object](kafkaParams.asJava)

  def set(key: String, value: Object): this.type = {
    params.put(key, value)
    this
  }

  def setIfUnset(key: String, value: Object): this.type = {
    params.putIfAbsent(key, value)
    this
  }

  /** With delegation tokens this would add a JAAS config; without, the options stand as set. */
  def setAuthenticationConfigIfNeeded(): this.type = this

  def setAuthenticationConfigIfNeeded(clusterConfig: Option[KafkaTokenClusterConf]): this.type =
    this

  def build(): ju.Map[String, Object] = params
}
