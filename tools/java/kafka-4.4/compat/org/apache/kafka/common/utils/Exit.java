// Bridge for MirrorMaker 2 4.3.1 (org.apache.kafka.connect.mirror.MirrorMaker) in the 4.4 jar
// set: Kafka 4.4 moved Exit to org.apache.kafka.common.utils.internals. This forwards the calls
// the 4.3.1 MirrorMaker makes to Kafka 4.4's own class, unchanged (see AppInfoParser.java).
package org.apache.kafka.common.utils;

public final class Exit {
    private Exit() {}

    public static void exit(int statusCode) {
        org.apache.kafka.common.utils.internals.Exit.exit(statusCode);
    }

    public static void exit(int statusCode, String message) {
        org.apache.kafka.common.utils.internals.Exit.exit(statusCode, message);
    }

    public static void halt(int statusCode) {
        org.apache.kafka.common.utils.internals.Exit.halt(statusCode);
    }

    public static void addShutdownHook(String name, Runnable runnable) {
        org.apache.kafka.common.utils.internals.Exit.addShutdownHook(name, runnable);
    }
}
