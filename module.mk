# nginx module rules (filled in by the module work)
module:
	@true
