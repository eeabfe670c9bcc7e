"""Notifications: tenants' webhooks and the events they are sent. `notices` decides what each
event tells whom; `hooks` keeps the hooks and sends them."""
