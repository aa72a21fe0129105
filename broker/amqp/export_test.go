package amqp

// SetConsistentHashType makes DeclarePartitioned declare exchanges of type t, and returns
// a function that restores the real type.
func SetConsistentHashType(t string) (restore func()) {
	old := consistentHashType
	consistentHashType = t
	return func() { consistentHashType = old }
}
