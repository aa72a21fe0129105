package headers

// Headers the dead-letter operations (package dlq) stamp on the copies they publish; moved
// from package dlq (HeaderEditedAt, HeaderEditedBy, HeaderOriginalSHA256). Values unchanged.
const (
	// EditedAt is when an edited copy was edited (RFC 3339).
	EditedAt = "x-sluice-edited-at"
	// EditedBy is who edited it (dlq.Operator.Actor).
	EditedBy = "x-sluice-edited-by"
	// OriginalSHA256 is the SHA-256 of the payload before the edit, hex-encoded; the
	// original itself is in the archive.
	OriginalSHA256 = "x-sluice-original-sha256"
	// ArchivedAt is when a message was archived (RFC 3339), set on its copy in
	// Q.dlq.archive and removed by a replay.
	ArchivedAt = "x-archived-at"
)
