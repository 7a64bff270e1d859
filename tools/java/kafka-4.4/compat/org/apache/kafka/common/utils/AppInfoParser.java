// Bridge for the Kafka 4.3.1 Connect plugins in the 4.4 jar set (connect-file, connect-mirror:
// 4.4.0 of those is not served to this project). Kafka 4.4 moved this class to
// org.apache.kafka.common.utils.internals; the 4.3.1 connectors still call the old name from
// their version() methods. This forwards those calls to Kafka 4.4's own class, unchanged.
// Compiled by scripts/fetch-jars.sh into .cache/jars/classes-4.4/.
package org.apache.kafka.common.utils;

public final class AppInfoParser {
    private AppInfoParser() {}

    public static String getVersion() {
        return org.apache.kafka.common.utils.internals.AppInfoParser.getVersion();
    }

    public static String getCommitId() {
        return org.apache.kafka.common.utils.internals.AppInfoParser.getCommitId();
    }
}
