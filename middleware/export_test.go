package middleware

// Waiting returns how many messages wait for a group of g.
func (g *DedupGroup) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}
