-- Threads (conversational runs): the last message of the conversation, the user's
-- or the model's, as `runs` and the UI list them; NULL for a run that is no thread.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS last_message text;
