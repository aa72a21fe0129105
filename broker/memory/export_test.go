package memory

// TopicMatch is topicMatch, for the table test of the topic rules.
var TopicMatch = topicMatch
