package dlq

// SkipDestinationCheck lets r publish to a missing queue, so that the publish is returned
// at commit and the restore path runs.
func SkipDestinationCheck(r *Replayer) { r.skipDestinationCheck = true }

// SelectionRecord is selectionRecord, for comparing it with NewRecord.
var SelectionRecord = selectionRecord
