"""Time: the database's clock every due time is read on (`clock`), people's time zones
(`timezones`), deadlines and reminders (`deadlines`), and schedules (`schedules`)."""
